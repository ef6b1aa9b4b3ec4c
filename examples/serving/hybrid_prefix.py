"""A hybrid model answering questions about one long entry three ways: prefill, graft, and llama-server's
prompt cache. Prefilled tokens and time to first token for each, in one run.

A recurrent state cannot be cut at an arbitrary prefix, so llama.cpp's own prompt cache struggles with hybrid
models: a second request that shares only the entry with the first may prefill everything again. A graft
does not cut: it restores the whole state saved at the end of the entry, then prefills the question.

For each architecture (tiny random-weight models of the matrix, a dense one as the control) it writes the
model, builds a one-entry library whose text RAG prompt is ~1,100 tokens, and asks ``--questions`` different
questions about it, each three ways:

- kvgraft ``mode="text-rag"``: the entry and the question prefilled (the prefill baseline);
- kvgraft ``mode="graft"``: the entry's state restored, the question prefilled;
- llama-server (`build_llama_server.sh`, ``--cache-ram``, one slot), sent the text RAG prompt's token ids:
  each request shares the entry as a prefix with the one before it; its ``timings.prompt_n`` is what it
  prefilled.

Medians over the questions (the first llama-server request, with nothing cached, is left out), one token
decoded, 2 threads:

    python examples/serving/hybrid_prefix.py --llama-server ~/.cache/kvgraft/llama-server/build/bin/llama-server

Not part of ``make test``. docs/exactness.md has its table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kvgraft_plugin import Entry, GraftEngine, build_library
from kvgraft_plugin.tools.tiny_models import write_tiny_model

SETTINGS = {"n_ctx": 4096, "n_threads": 2}
SENTENCE = "The pump moves 12 litres a minute into the tank, and the valve lets 5 litres a minute out. "


def entry(n_chars: int) -> Entry:
    """One long worked entry: with the byte-level vocabulary of the tiny models, a character is a token."""
    solution = (SENTENCE * (n_chars // len(SENTENCE) + 1))[:n_chars]
    return Entry("tank", "How fast does the tank fill?", solution + " So it fills at 7 litres a minute.", "7")


def questions(n: int) -> list[str]:
    return [f"After {k + 2} minutes, how many litres are in the tank?" for k in range(n)]


def text_rag_tokens(engine: GraftEngine, question: str) -> list[int]:
    """What kvgraft's text RAG prefills for ``question`` about the entry: its prefix, then the query."""
    record = engine.library.get("tank")
    return engine.prompts.prefix(record) + engine.prompts.suffix(question, same_as=record.entry)


def kvgraft_rows(engine: GraftEngine, asked: list[str]) -> dict[str, dict[str, float]]:
    rows = {}
    for mode in ("text-rag", "graft"):
        results = [engine.ask(q, mode=mode, entry_id="tank", max_tokens=1, stop=[]) for q in asked]
        assert all(r.route == mode for r in results), [r.fallback_reason for r in results]
        rows[mode] = {
            "prefilled": statistics.median(r.prefill_tokens for r in results),
            "restored": statistics.median(r.restored_tokens for r in results),
            "ttft_ms": statistics.median(r.ttft_ms for r in results),
        }
    return rows


def server_row(binary: str, model: Path, prompts: list[list[int]], port: int) -> dict[str, float]:
    command = [binary, "-m", str(model), "--port", str(port), "-t", "2", "-c", str(SETTINGS["n_ctx"]), "-np", "1",
               "--cache-ram", "1024", "--swa-full", "-fa", "off", "--no-webui"]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("llama-server did not come up")
            time.sleep(0.2)
        prefilled, ttft = [], []
        for prompt in prompts:
            body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True}
            start = time.perf_counter()
            timings = httpx.post(f"{url}/completion", json=body, timeout=600).json()["timings"]
            ttft.append(1000 * (time.perf_counter() - start))
            prefilled.append(timings["prompt_n"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"prefilled": statistics.median(prefilled[1:]), "restored": 0, "ttft_ms": statistics.median(ttft[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default="qwen35,lfm2,granitehybrid,llama")
    parser.add_argument("--entry-chars", type=int, default=450)
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary: run it too")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for n, arch in enumerate(args.archs.split(",")):
            model = write_tiny_model(Path(scratch) / f"{arch}.gguf", arch)
            library = Path(scratch) / f"{arch}-lib"
            with GraftEngine(None, model_path=str(model), **SETTINGS) as builder:  # type: ignore[arg-type]
                build_library(library, [entry(args.entry_chars)], engine=builder)
            asked = questions(args.questions)
            with GraftEngine(library, model_path=str(model), **SETTINGS) as engine:  # type: ignore[arg-type]
                found = kvgraft_rows(engine, asked)
                prompts = [engine.run_exclusive(lambda _, q=q: text_rag_tokens(engine, q)) for q in asked]
            if args.llama_server:
                found["llama-server"] = server_row(args.llama_server, model, prompts, 8900 + n)
            for way, row in found.items():
                rows.append({"arch": arch, "way": way, "prompt_tokens": len(prompts[0]), **row})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("| arch | way | prompt tokens | prefilled | restored | TTFT |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['way']} | {r['prompt_tokens']} | {r['prefilled']:.0f} | {r['restored']:.0f} | "
              f"{r['ttft_ms']:.1f} ms |")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
