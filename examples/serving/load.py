"""Throughput of ``kvgraft serve`` under concurrent clients, batched against serial, in one run.

For each concurrency C it starts ``kvgraft serve --max-batch C`` (C = 1: the serial server) on the library,
sends every query from C client threads through the ``openai`` client (streamed, so the time to the first
token is the client's), and stops the server. It reports requests/s, decoded tokens/s and their ratio to
the serial server, TTFT p50/p95, and how many answers equal the serial server's, text and route.

With ``--llama-server PATH`` (`build_llama_server.sh`) it runs the anchor the same way: llama.cpp's own
server on the same GGUF with C slots, continuous batching and its host-RAM prompt cache (``--cache-ram``),
each query sent as the token ids kvgraft's text RAG prefills (the matched entry pasted before the question;
plain queries as plain), greedy; its batched answers are compared with its own serial ones.

    python examples/serving/load.py --library lib/ --queries examples/code/queries.jsonl --concurrency 1,2,4,8

Not part of ``make test``: it takes minutes. docs/batched-serving.md has its tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class Answer:
    text: str
    route: str
    ttft: float
    tokens: int


def wait_up(url: str, proc: subprocess.Popen, path: str = "/health") -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("server did not come up")


def kvgraft_server(args: argparse.Namespace, concurrency: int) -> tuple[subprocess.Popen, str]:
    port = 8765 + concurrency
    command = [sys.executable, "-m", "kvgraft_plugin.cli", "serve", "--library", args.library, "--port", str(port),
               "--max-batch", str(concurrency), "--max-queue", str(len(args.questions)),
               "--n-threads", str(args.threads), "--decode", "step"]  # fmt: skip
    if args.model:
        command += ["--model", args.model]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_up(url, proc)
    return proc, url


def ask_kvgraft(url: str, question: str, max_tokens: int) -> Answer:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    start = time.perf_counter()
    ttft, pieces, extra, tokens = None, [], {}, 0
    stream = client.completions.create(model="kvgraft", prompt=question, max_tokens=max_tokens, stream=True,
                                       stream_options={"include_usage": True})  # fmt: skip
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            ttft = ttft if ttft is not None else time.perf_counter() - start
            pieces.append(chunk.choices[0].text)
        if chunk.choices and chunk.choices[0].finish_reason:
            extra = chunk.model_extra.get("kvgraft", {})
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return Answer("".join(pieces), extra.get("route", "?"), ttft or time.perf_counter() - start, tokens)


def anchor_prompts(args: argparse.Namespace) -> list[tuple[list[int], str]]:
    """Each query's tokens as kvgraft's text RAG (matched) or plain route prefills them, and its route."""
    from kvgraft_plugin import GraftEngine

    prompts = []
    with GraftEngine(args.library, **({"model_path": args.model} if args.model else {})) as engine:
        for question in args.questions:
            result = engine.ask(question, max_tokens=1)
            if result.entry_id is not None:
                record = engine.library.get(result.entry_id)
                tokens = engine.run_exclusive(
                    lambda _, r=record, q=question: engine.prompts.prefix(r) + engine.prompts.suffix(q, same_as=r.entry)
                )
            else:
                tokens = engine.run_exclusive(
                    lambda _, q=question: engine.prompts.preamble() + engine.prompts.suffix(q)
                )
            prompts.append((tokens, result.route))
        stop = list(engine.template.stop(args.questions[0]))
        gguf = str(engine.model_path)
    args.anchor_stop, args.gguf = stop, gguf
    return prompts


def llama_server(args: argparse.Namespace, concurrency: int) -> tuple[subprocess.Popen, str]:
    port = 8865 + concurrency
    command = [args.llama_server, "-m", args.gguf, "--port", str(port), "-t", str(args.threads),
               "-c", str(4096 * concurrency), "-np", str(concurrency), "--cont-batching",
               "--cache-ram", "1024", "--swa-full", "-fa", "off", "--no-webui"]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_up(url, proc)
    return proc, url


def ask_anchor(url: str, prompt: tuple[list[int], str], max_tokens: int, stop: list[str]) -> Answer:
    body = {"prompt": prompt[0], "n_predict": max_tokens, "temperature": 0, "cache_prompt": True, "stream": True,
            "stop": stop}  # fmt: skip
    start = time.perf_counter()
    ttft, pieces, tokens = None, [], 0
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("content"):
                ttft = ttft if ttft is not None else time.perf_counter() - start
                pieces.append(event["content"])
            if event.get("stop"):
                tokens = event.get("tokens_predicted", 0)
    return Answer("".join(pieces), prompt[1], ttft or time.perf_counter() - start, tokens)


def run(name: str, start_server, ask, items: list, levels: list[int]) -> list[dict]:
    rows, serial = [], None
    for concurrency in levels:
        proc, url = start_server(concurrency)
        try:
            ask(url, items[0])  # warm: the first request pays for lazy loads
            t0 = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                answers = list(pool.map(lambda item, url=url: ask(url, item), items))
            wall = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        serial = serial or answers
        ttfts = sorted(a.ttft for a in answers)
        rows.append({
            "server": name, "concurrency": concurrency, "requests": len(answers), "seconds": round(wall, 2),
            "requests_per_s": round(len(answers) / wall, 3),
            "tokens_per_s": round(sum(a.tokens for a in answers) / wall, 1),
            "ttft_p50_ms": round(1000 * statistics.median(ttfts)),
            "ttft_p95_ms": round(1000 * ttfts[int(0.95 * (len(ttfts) - 1))]),
            "identical": sum(a.text == s.text and a.route == s.route for a, s in zip(answers, serial)),
            "routes": {r: sum(a.route == r for a in answers) for r in sorted({a.route for a in answers})},
        })  # fmt: skip
        base = rows[0]
        rows[-1]["speedup"] = round(rows[-1]["tokens_per_s"] / base["tokens_per_s"], 2)
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", required=True)
    parser.add_argument("--queries", required=True, type=Path)
    parser.add_argument("--model", help="model name or GGUF (default: the library's)")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=0, help="use the first N queries (0: all)")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary: run the anchor too")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    queries = [json.loads(line) for line in args.queries.read_text().splitlines() if line.strip()]
    args.questions = [q["question"] for q in queries][: args.limit or None]
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = run("kvgraft", lambda c: kvgraft_server(args, c), lambda url, q: ask_kvgraft(url, q, args.max_tokens),
               args.questions, levels)  # fmt: skip
    if args.llama_server:
        prompts = anchor_prompts(args)
        rows += run("llama-server", lambda c: llama_server(args, c),
                    lambda url, p: ask_anchor(url, p, args.max_tokens, args.anchor_stop), prompts, levels)  # fmt: skip
    print("| server | concurrent | requests/s | decoded tok/s | vs serial | TTFT p50 | TTFT p95 | same as serial |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['server']} | {r['concurrency']} | {r['requests_per_s']} | {r['tokens_per_s']} | {r['speedup']}x | "
              f"{r['ttft_p50_ms']} ms | {r['ttft_p95_ms']} ms | {r['identical']}/{r['requests']} |")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
