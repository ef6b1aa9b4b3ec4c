"""``kvgraft bench-graft``: what a graft costs, measured in one run.

For each prefix length: the restore against a numpy copy of the same bytes, TTFT of graft, text RAG
and plain with their phases, and bytes on disk per token against the f16 KV bound. ``--sweep`` adds a
longer bitwise sweep of prefix and query lengths than the test suite runs. ``--decode`` measures the decode
loop's token rate per sampler (`decode_rates`).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvgraft_plugin.core.backend import Backend
from kvgraft_plugin.core.sampling import SamplingParams
from kvgraft_plugin.engine.engine import GraftEngine
from kvgraft_plugin.library.template import render_preamble, render_query

__all__ = ["bench_graft", "decode_rates", "exactness_sweep"]

#: The samplers `decode_rates` compares, besides numpy's argmax over a copy of the logits (the engine's
#: greedy step before it sampled with llama.cpp's chain).
DECODE_SAMPLERS = {
    "chain greedy": SamplingParams(),
    "chain T=0.8 top-p min-p penalties": SamplingParams(
        temperature=0.8, top_p=0.95, min_p=0.05, repeat_penalty=1.1, presence_penalty=0.2
    ),
}

_TEXT = " ".join(
    f"Step {k}: {k} times {k + 3} is {k * (k + 3)}, and adding {k} gives {k * (k + 4)}." for k in range(1, 900)
)
_QUERY = render_query("Using the steps above, what is 12 times 15, and what do you get when you add 12 to it?")


def _median_ms(func: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        func()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def kv_f16_bytes_per_token(backend: Backend) -> int:
    """K+V bytes per token at f16 for every layer: the bound a KV state cannot beat uncompressed."""
    arch = backend.arch
    n_layer = int(backend.meta(f"{arch}.block_count"))
    n_head = int(backend.meta(f"{arch}.attention.head_count"))
    n_head_kv = int(backend.meta(f"{arch}.attention.head_count_kv") or n_head)
    n_embd = int(backend.meta(f"{arch}.embedding_length"))
    k_len = int(backend.meta(f"{arch}.attention.key_length") or n_embd // n_head)
    v_len = int(backend.meta(f"{arch}.attention.value_length") or n_embd // n_head)
    return n_layer * n_head_kv * (k_len + v_len) * 2


def bench_graft(engine: GraftEngine, lengths: list[int], *, repeat: int = 5) -> list[dict[str, Any]]:
    """Restore vs memcpy, and TTFT of graft / text RAG / plain, for each prefix length."""
    stream = engine.tokenize(_TEXT, add_bos=True)
    query = engine.tokenize(_QUERY)
    preamble = engine.tokenize(render_preamble(), add_bos=True)
    return engine.run_exclusive(lambda backend: _bench_rows(backend, stream, query, preamble, lengths, repeat))


def _bench_rows(
    backend: Backend, stream: list[int], query: list[int], preamble: list[int], lengths: list[int], repeat: int
) -> list[dict[str, Any]]:
    bound = kv_f16_bytes_per_token(backend)
    rows = []
    for n in lengths:
        prefix = stream[:n]
        backend.reset()
        backend.prefill(prefix)
        payload = backend.capture_state()
        src = np.frombuffer(payload, dtype=np.uint8)
        dst = np.empty_like(src)
        copy_ms = _median_ms(lambda: np.copyto(dst, src), repeat)  # noqa: B023
        restore_ms = _median_ms(lambda: backend.restore_state(payload, n), repeat)  # noqa: B023

        def first_token(restore: bool, tokens: list[int]) -> dict[str, float]:
            t0 = time.perf_counter()
            if restore:
                backend.restore_state(payload, n)  # noqa: B023
            else:
                backend.reset()
            t1 = time.perf_counter()
            logits = backend.prefill(tokens)
            int(np.argmax(logits))
            t2 = time.perf_counter()
            return {"restore": (t1 - t0) * 1000, "prefill": (t2 - t1) * 1000, "ttft": (t2 - t0) * 1000}

        def median_phases(restore: bool, tokens: list[int]) -> dict[str, float]:
            runs = [first_token(restore, tokens) for _ in range(max(1, repeat // 2))]
            return {k: statistics.median(r[k] for r in runs) for k in runs[0]}

        graft = median_phases(True, query)
        text_rag = median_phases(False, prefix + query)
        plain = median_phases(False, preamble + query)
        rows.append(
            {
                "prefix_tokens": n,
                "state_mib": len(payload) / 2**20,
                "copy_ms": copy_ms,
                "restore_ms": restore_ms,
                "restore_vs_copy": restore_ms / copy_ms if copy_ms else float("inf"),
                "graft": graft,
                "text_rag": text_rag,
                "plain": plain,
                "graft_vs_plain": graft["ttft"] / plain["ttft"],
                "text_rag_vs_graft": text_rag["ttft"] / graft["ttft"],
                "bytes_per_token": len(payload) / n,
                "f16_bound_per_token": bound,
            }
        )
    return rows


def decode_rates(engine: GraftEngine, *, n_tokens: int = 64, repeat: int = 3) -> dict[str, float]:
    """Decode tokens/s of each sampler in `DECODE_SAMPLERS` and of the numpy argmax reference, over the
    same prompt; the runs alternate so that a slow moment of the machine hits them all alike."""
    prompt = engine.tokenize(_TEXT[:600], add_bos=True)

    def numpy_argmax(backend: Backend) -> None:
        logits = backend.prefill(prompt)
        for _ in range(n_tokens):
            logits = backend.prefill([int(np.argmax(logits))])

    def chain(params: SamplingParams) -> Callable[[Backend], None]:
        def run(backend: Backend) -> None:
            backend.prefill(prompt)
            sampler = backend.sampler(params, prompt)
            for _ in range(n_tokens):
                backend.decode(sampler.sample())
            sampler.close()

        return run

    runs: dict[str, Callable[[Backend], None]] = {"numpy argmax (before)": numpy_argmax}
    runs |= {name: chain(params) for name, params in DECODE_SAMPLERS.items()}

    def measure(backend: Backend) -> dict[str, float]:
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeat):
            for name, run in runs.items():
                backend.reset()
                t0 = time.perf_counter()
                run(backend)
                seconds[name].append(time.perf_counter() - t0)

        def prefill() -> None:
            backend.reset()
            backend.prefill(prompt)

        prefill_s = _median_ms(prefill, repeat) / 1000
        backend.reset()
        return {name: n_tokens / (statistics.median(s) - prefill_s) for name, s in seconds.items()}

    return engine.run_exclusive(measure)


def exactness_sweep(
    engine: GraftEngine, *, n_cases: int = 40, seed: int = 0, max_prefix: int | None = None
) -> list[dict[str, Any]]:
    """Bitwise restore checks over a seeded sample of (prefix, query) lengths."""
    stream = engine.tokenize(_TEXT, add_bos=True)
    query_stream = engine.tokenize(_QUERY * 3)
    top = min(max_prefix or engine.n_ctx - 64, len(stream), engine.n_ctx - 64)
    rng = random.Random(seed)
    out = []
    for _ in range(n_cases):
        n, q = rng.randrange(16, top), rng.randrange(1, 41)
        diff = engine.capture(stream[:n], probe=query_stream[:q]).max_diff
        out.append({"prefix_tokens": n, "query_tokens": q, "exact": diff == 0.0, "max_diff": diff})
    return out
