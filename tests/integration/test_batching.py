"""Batched decoding on llama.cpp: sequences decoded together give bitwise the logits each gets alone, and
concurrent requests through a batched engine get the serial engine's answers, route and text, on every route
(graft restored into sequences 1-3 as well as 0, text RAG and plain). A batch that does not fit in memory
is a clear error before llama.cpp allocates it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from kvgraft_plugin import ConfigError, GraftEngine
from kvgraft_plugin.engine.batch_invariance import measure_sequences
from tests.conftest import THREADS

#: (question, route forced or None for auto): grafts, a text-RAG answer, plain ones, one left uncovered.
REQUESTS = [
    ("What is 17 times 23?", None),
    ("What is the greatest common divisor of 84 and 126?", None),
    ("What is 17 times 23?", "text-rag"),
    ("What is the capital of France?", None),
    ("Write a long story about a robot.", "plain"),
    ("Solve for x: 5x - 7 = 3x + 9.", None),
    ("What is the greatest common divisor of 84 and 126?", "text-rag"),
    ("Name a colour.", None),
]


def ask_all(engine: GraftEngine, workers: int) -> list:
    def ask(item):
        question, mode = item
        return engine.ask(question, mode=mode or "auto", max_tokens=24, stop=["\n\n"], decode="step")

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(ask, REQUESTS))


@pytest.fixture(scope="module")
def serial(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=THREADS) as engine:
        yield ask_all(engine, 1)


@pytest.mark.parametrize("model", ["gemma_path", "smol_path"])
def test_sequences_together_are_bitwise_each_alone(model, request, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # measured here, not read from a cache
    path = request.getfixturevalue(model)
    with GraftEngine(None, model_path=str(path), n_threads=THREADS, max_batch=4, decode="step") as engine:
        assert engine.max_batch == 4
        report = engine.run_exclusive(measure_sequences)
    assert [row.k for row in report.rows] == [2, 3, 4]
    assert all(row.bitwise and row.max_diff == 0.0 for row in report.rows), report.rows
    assert report.max_batch == 4


def test_concurrent_requests_in_a_batch_equal_serial_answers(small_library, gemma_path, serial):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=THREADS, max_batch=4) as engine:
        batched = ask_all(engine, len(REQUESTS))
        stats = engine.batch_stats
    assert [r.route for r in serial] == ["graft", "graft", "text-rag", "plain", "plain", "graft", "text-rag", "plain"]
    assert [(r.route, r.entry_id, r.text) for r in batched] == [(r.route, r.entry_id, r.text) for r in serial]
    assert [r.decode_tokens for r in batched] == [r.decode_tokens for r in serial]
    assert [r.finish_reason for r in batched] == [r.finish_reason for r in serial]
    assert max(stats.steps) > 1 and stats.tokens > 0  # sequences really were decoded together


def test_a_batch_that_does_not_fit_in_memory_is_refused(gemma_path):
    with pytest.raises(ConfigError, match=r"64 sequences of n_ctx=131072 need .* GiB of KV cache.*--max-batch"):
        GraftEngine(None, model_path=str(gemma_path), n_threads=THREADS, n_ctx=131072, n_batch=512, max_batch=64)
