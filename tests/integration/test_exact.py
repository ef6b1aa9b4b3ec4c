"""The key claim: a grafted KV cache gives logits bitwise equal to a fresh prefill.

Swept on a sliding-window model (Gemma 3 270M, window 512) and a dense one (SmolLM2-135M), with
prefix lengths from ~100 to ~2000 and query lengths 1 to 40. The sample is seeded and always holds the
lengths that broke the plain sequence API (650, 700, 1500) and the one that broke a window-sized SWA
cache (~1973). `make bench` runs a longer sweep.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.helpers import assert_bitwise

LONG_TEXT = " ".join(
    f"Step {k}: {k} times {k + 3} is {k * (k + 3)}, and adding {k} gives {k * (k + 4)}." for k in range(1, 400)
)
QUERY_TEXT = (
    " Question: what is the sum of 3 and 4, and then what do you get when you multiply that sum by the"
    " number of steps listed above, rounded to the nearest ten? Answer:"
)


def _pairs(known: list[tuple[int, int]], n_random: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    extra = [(rng.randrange(100, 2000), rng.randrange(1, 41)) for _ in range(n_random)]
    return known + extra


GEMMA_PAIRS = _pairs([(650, 14), (700, 14), (700, 3), (1500, 14), (1973, 23), (2000, 40), (96, 1)], 3, seed=7)
SMOL_PAIRS = _pairs([(700, 14), (1500, 23), (128, 1)], 2, seed=11)
CASES = [("gemma", p, q) for p, q in GEMMA_PAIRS] + [("smol", p, q) for p, q in SMOL_PAIRS]


@pytest.fixture(scope="module")
def streams(request):
    """Long token streams per model, cut to each case's lengths."""
    out = {}
    for name in ("gemma", "smol"):
        backend = request.getfixturevalue(name).backend
        out[name] = (
            backend.tokenize(LONG_TEXT, add_bos=True),
            backend.tokenize(QUERY_TEXT, add_bos=False),
        )
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("model", "n_prefix", "n_query"), CASES, ids=[f"{m}-{p}-{q}" for m, p, q in CASES])
def test_restore_then_query_equals_fresh_prefill(request, streams, model, n_prefix, n_query):
    backend = request.getfixturevalue(model).backend
    long_tokens, query_tokens = streams[model]
    assert len(long_tokens) >= n_prefix and len(query_tokens) >= n_query
    prefix, query = long_tokens[:n_prefix], query_tokens[:n_query]

    backend.reset()
    backend.prefill(prefix)
    payload = backend.capture_state()
    reference = backend.prefill(query)  # a fresh full prefill: prefix, then query

    backend.restore_state(payload, n_prefix)
    grafted = backend.prefill(query)
    assert_bitwise(reference, grafted, f"{model} prefix={n_prefix} query={n_query}")


@pytest.mark.slow
def test_restore_into_a_used_context_equals_a_brand_new_context(gemma, gemma_path, streams):
    """The session engine's context has served many requests; a new one has served none."""
    from kvgraft_plugin import GraftEngine

    long_tokens, query_tokens = streams["gemma"]
    prefix, query = long_tokens[:700], query_tokens[:9]
    with GraftEngine(None, model_path=str(gemma_path), n_threads=2) as fresh:
        fresh.backend.prefill(prefix)
        reference = fresh.backend.prefill(query)
    backend = gemma.backend
    backend.reset()
    backend.prefill(long_tokens[:1200])  # leave stale cells behind
    backend.reset()
    backend.prefill(prefix)
    payload = backend.capture_state()
    backend.reset()
    backend.prefill(long_tokens[:300])
    backend.restore_state(payload, len(prefix))
    assert_bitwise(reference, backend.prefill(query), "used context vs new context")


def test_state_holds_every_cell(gemma, streams):
    """Full-cell capture: both Gemma caches (global and SWA) hold every position of the prefix."""
    from kvgraft_plugin.adapters.llama_cpp import inspect_seq_state

    backend = gemma.backend
    backend.reset()
    backend.prefill(streams["gemma"][0][:600])
    info = inspect_seq_state(backend.capture_state())
    assert info.n_tokens == 600 and info.n_cells == (600, 600)


def test_window_sized_swa_cache_is_caught_as_inexact(gemma_path, streams):
    """Without swa_full the SWA cache wraps past ~1024 cells; the build-time check flags it."""
    from kvgraft_plugin import Entry, GraftEngine
    from kvgraft_plugin.curation.build import capture_entry

    long_text = " ".join(f"Step {k}: add {k} squared, which is {k * k}." for k in range(1, 400))
    entry = Entry("long", "What is the sum of squares?", " ".join(long_text.split()[:840]))
    with GraftEngine(None, model_path=str(gemma_path), n_threads=2, swa_full=False) as small_swa:
        tokens, _, max_diff = capture_entry(small_swa, entry)
    assert len(tokens) > 1500
    assert max_diff > 0, "expected the window-sized SWA cache to be inexact at this length"
    assert np.isfinite(max_diff)
