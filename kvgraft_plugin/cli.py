"""The ``kvgraft`` command line. Library errors become one clean line and exit status 1."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from ._config import KV_TYPES, EngineConfig, LlamaConfig
from ._exceptions import KVGraftError, QueryError, SourceError

F = TypeVar("F", bound=Callable[..., Any])

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc).strip() or type(exc).__name__)


def llama_options(func: F) -> F:
    """The pinned llama.cpp settings, shared by every command that loads the model."""
    options = [
        click.option(
            "--model",
            "model_path",
            type=click.Path(dir_okay=False),
            help="GGUF file (default: the library's, else Gemma 3 270M).",
        ),
        click.option("--n-ctx", type=int, help="Context length (default 4096)."),
        click.option("--n-batch", type=int, help="Prefill chunk size (default 512)."),
        click.option("--n-ubatch", type=int, help="Physical micro-batch (default 512)."),
        click.option("--n-threads", type=int, help="CPU threads (default: cores, at most 8)."),
        click.option("--n-gpu-layers", type=int, help="Layers offloaded to a GPU (default 0)."),
        click.option("--type-k", type=click.Choice(sorted(KV_TYPES)), help="K cache type (default f16)."),
        click.option("--type-v", type=click.Choice(sorted(KV_TYPES)), help="V cache type (default f16)."),
        click.option("--flash-attn/--no-flash-attn", default=None, help="Flash attention (default off)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def routing_options(func: F) -> F:
    """Routing settings for ``ask`` and ``bench``."""
    options = [
        click.option("--threshold", type=float, help="Cosine threshold (default: the library's calibrated one)."),
        click.option("--margin", type=float, help="Required gap between the two best scores."),
        click.option("--top-k", type=int, help="Neighbours searched."),
        click.option(
            "--key-file",
            type=click.Path(dir_okay=False),
            envvar="KVGRAFT_KEY_FILE",
            help="HMAC key: only a library signed with it is used [env KVGRAFT_KEY_FILE].",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


_LLAMA_FIELDS = {
    "model_path",
    "n_ctx",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "n_gpu_layers",
    "type_k",
    "type_v",
    "flash_attn",
}


def make_config(options: dict[str, Any], **engine: Any) -> EngineConfig:
    """An `EngineConfig` from CLI options (``None`` means "default")."""
    llama = {k: v for k, v in options.items() if k in _LLAMA_FIELDS and v is not None}
    rest = {k: v for k, v in {**options, **engine}.items() if k not in _LLAMA_FIELDS and v is not None}
    try:
        return EngineConfig(llama=LlamaConfig(**llama), **rest)
    except KVGraftError as exc:
        raise _fail(exc) from exc


def _engine(library: str | None, config: EngineConfig) -> Any:
    from ._engine import GraftEngine

    return GraftEngine(library, config=config)


@click.group()
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
@click.version_option(package_name="kvgraft-plugin")
def main(verbose: int) -> None:
    """kvgraft: graft verified solved problems into llama.cpp's KV cache, exactly."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@main.command()
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("--library", required=True, type=click.Path(file_okay=False), help="Library folder.")
@click.option("--rebuild", is_flag=True, help="Rebuild every entry.")
@click.option("--resume", is_flag=True, help="Finish an interrupted build (the default behaviour; kept for clarity).")
@click.option("--prune", is_flag=True, help="Remove entries that are not in SOURCE.")
@click.option("--skip-invalid", is_flag=True, help="Skip entries that fail verification instead of failing.")
@click.option("--index", "index_kind", type=click.Choice(["flat", "hnsw"]), help="faiss index type (default flat).")
@click.option("--embedder", help="sentence-transformers model name or path (default: bundled MiniLM).")
@click.option("--threshold", type=float, help="Routing threshold stored in the library.")
@llama_options
def build(
    source: str,
    library: str,
    rebuild: bool,
    resume: bool,
    prune: bool,
    skip_invalid: bool,
    index_kind: str | None,
    embedder: str | None,
    threshold: float | None,
    **options: Any,
) -> None:
    """Build (or update) a library from SOURCE.jsonl: KV states, manifest and index."""
    from tqdm import tqdm

    from ._build import build_library
    from ._engine import GraftEngine
    from ._library import Library, read_source

    try:
        entries = read_source(source)
        if options.get("model_path") is None and (Path(library) / "manifest.json").is_file():
            remembered = Library.open(library).model
            if remembered.get("bundled") is None and remembered.get("path"):
                options["model_path"] = remembered["path"]
        config = make_config(options, embedder=embedder)
        with GraftEngine(None, config=config) as engine, tqdm(total=len(entries), desc="build", unit="entry") as bar:
            report = build_library(
                library,
                entries,
                engine=engine,
                rebuild=rebuild,
                prune=prune,
                skip_invalid=skip_invalid,
                index_kind=index_kind,  # type: ignore[arg-type]
                threshold=threshold,
                progress=bar.update,
            )
    except KVGraftError as exc:
        raise _fail(exc) from exc
    click.echo(
        f"built {len(report.built)}, unchanged {len(report.skipped)}, removed {len(report.removed)}, "
        f"invalid {len(report.invalid)}, inexact {len(report.inexact)} -> {library}"
    )


def _read_queries(path: str) -> Iterator[dict[str, Any]]:
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise _fail(exc) from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise _fail(SourceError(f"{path}:{lineno}: {exc}")) from exc
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("id"), str):
            raise _fail(SourceError(f'{path}:{lineno}: expected {{"id": str, "question": str, ...}}'))
        yield row


@main.command()
@click.argument("question", required=False)
@click.option("--library", type=click.Path(file_okay=False), help="Library folder (omit for plain decoding).")
@click.option("--mode", type=click.Choice(["auto", "graft", "text-rag", "plain"]), default="auto", show_default=True)
@click.option("--entry", "entry_id", help="Force this entry instead of routing.")
@click.option("--queries", type=click.Path(exists=True, dir_okay=False), help="Answer every line of a queries JSONL.")
@click.option("--max-tokens", type=int, help="Decode budget (default 64).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per answer.")
@routing_options
@llama_options
def ask(
    question: str | None,
    library: str | None,
    mode: str,
    entry_id: str | None,
    queries: str | None,
    max_tokens: int | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Answer QUESTION (or every line of --queries) through the library."""
    if (question is None) == (queries is None):
        raise click.UsageError("give either QUESTION or --queries")
    config = make_config(options, max_tokens=max_tokens)
    rows = list(_read_queries(queries)) if queries else [{"id": None, "question": question}]
    try:
        with _engine(library, config) as engine:
            for row in rows:
                try:
                    result = engine.ask(row["question"], mode=mode, entry_id=entry_id)
                except QueryError as exc:
                    if not queries:
                        raise
                    click.echo(json.dumps({"id": row["id"], "error": str(exc)}) if as_json else f"error: {exc}")
                    continue
                if as_json:
                    out = result.to_json()
                    if queries:
                        out = {"id": row["id"], **out}
                    click.echo(json.dumps(out, ensure_ascii=False))
                else:
                    click.echo(result.text)
                    reason = f" ({result.fallback_reason})" if result.fallback_reason else ""
                    click.echo(
                        f"[{result.route} {result.entry_id or '-'}{reason}; {result.decode_tokens} decode tokens, "
                        f"ttft {result.ttft_ms:.0f} ms]",
                        err=True,
                    )
    except KVGraftError as exc:
        raise _fail(exc) from exc


@main.command()
@click.option("--library", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def info(library: str, as_json: bool) -> None:
    """Show a library: entries, sizes, fingerprint, index and threshold."""
    from ._library import Library

    try:
        lib = Library.open(library)
    except KVGraftError as exc:
        raise _fail(exc) from exc
    entries: list[dict[str, Any]] = [
        {
            "id": r.id,
            "tokens": len(r.tokens),
            "state_bytes": r.state_bytes,
            "fidelity": r.fidelity,
            "problem": r.entry.problem[:60],
        }
        for r in lib.entries.values()
    ]
    data: dict[str, Any] = {
        "library": str(lib.path),
        "entries": entries,
        "n_entries": len(entries),
        "state_bytes": sum(e["state_bytes"] for e in entries),
        "model": lib.model,
        "fingerprint": lib.fingerprint,
        "embedder": lib.embedder,
        "index": {"kind": lib.index.get("kind"), "rows": len(lib.index.get("ids", []))},
        "threshold": lib.threshold,
        "signed": (lib.path / "manifest.sig").is_file(),
    }
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    click.echo(
        f"library   {data['library']}  ({data['n_entries']} entries, {data['state_bytes'] / 2**20:.1f} MiB of states)"
    )
    click.echo(
        f"model     {lib.model.get('bundled') or lib.model.get('path')}  sha256 {str(lib.model.get('sha256'))[:16]}…"
    )
    click.echo(f"index     {data['index']['kind']} ({data['index']['rows']} rows), embedder {lib.embedder.get('name')}")
    click.echo(f"threshold {lib.threshold}   signed {data['signed']}")
    click.echo("fingerprint " + ", ".join(f"{k}={v}" for k, v in lib.fingerprint.items() if k != "system_info"))
    click.echo(f"\n{'id':<24} {'tokens':>6} {'KiB':>8} {'fidelity':<8} problem")
    for e in entries:
        click.echo(f"{e['id']:<24} {e['tokens']:>6} {e['state_bytes'] / 1024:>8.0f} {e['fidelity']:<8} {e['problem']}")


@main.command()
@click.option(
    "--library", type=click.Path(file_okay=False), help="Where to build the demo library (default: cache dir)."
)
@click.option(
    "--source", type=click.Path(exists=True, dir_okay=False), help="Library source (default: examples/library.jsonl)."
)
@click.option(
    "--queries", type=click.Path(exists=True, dir_okay=False), help="Queries (default: examples/queries.jsonl)."
)
@click.option("--max-tokens", type=int, default=48, show_default=True)
@llama_options
def demo(library: str | None, source: str | None, queries: str | None, max_tokens: int, **options: Any) -> None:
    """The main job: build the example library once, then answer the example queries three ways."""
    from ._demo import run_demo
    from ._models import default_cache_dir

    source = source or str(EXAMPLES / "library.jsonl")
    queries = queries or str(EXAMPLES / "queries.jsonl")
    for path in (source, queries):
        if not Path(path).is_file():
            raise click.ClickException(f"{path} not found; pass --source and --queries")
    library = library or str(default_cache_dir() / "demo-library")
    try:
        run_demo(library, source, queries, config=make_config(options, max_tokens=max_tokens), echo=click.echo)
    except KVGraftError as exc:
        raise _fail(exc) from exc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
