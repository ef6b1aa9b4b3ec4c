"""One library on any machine: the settings left out of the fingerprint are proven harmless, bitwise."""

from __future__ import annotations

import numpy as np
import pytest

from kvgraft_plugin import GraftEngine
from kvgraft_plugin.library.fingerprint import MUST_MATCH, chunk_sizes
from tests.helpers import assert_bitwise


def test_chunk_sizes_never_end_in_a_single_token():
    assert chunk_sizes(1025, 512) == [512, 511, 2]
    assert chunk_sizes(1024, 512) == [512, 512]
    assert chunk_sizes(513, 512) == [511, 2]
    assert chunk_sizes(7, 512) == [7] and chunk_sizes(1, 512) == [1]
    for n in range(1, 2000, 37):
        sizes = chunk_sizes(n, 512)
        assert sum(sizes) == n and max(sizes) <= 512 and (n == 1 or min(sizes) > 1)


def test_threads_and_n_ctx_are_not_in_the_fingerprint():
    assert "n_threads" not in MUST_MATCH and "n_ctx" not in MUST_MATCH
    assert {"n_batch", "n_ubatch", "type_k", "type_v", "flash_attn", "swa_full", "n_gpu_layers"} <= set(MUST_MATCH)


def _prefill_and_capture(model_path, n_threads, tokens, n_ctx=4096):
    with GraftEngine(None, model_path=str(model_path), n_threads=n_threads, n_ctx=n_ctx) as engine:
        backend = engine.backend
        backend.reset()
        logits = backend.prefill(tokens)
        return logits, bytes(backend.capture_state())


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gemma_path", "smol_path"])
@pytest.mark.parametrize("length", [1025])  # 512 + 512 + 1 before the chunking rule; doctor checks others
def test_kv_bytes_and_logits_are_equal_at_any_thread_count(request, model, length):
    model_path = request.getfixturevalue(model)
    rng = np.random.default_rng(length)
    tokens = [int(t) for t in rng.integers(100, 20000, size=length)]
    ref_logits, ref_state = _prefill_and_capture(model_path, 2, tokens)
    for n_threads in (1, 4):  # 8 was bitwise too (measured once; 4x oversubscribed on 2 cores, it is slow)
        logits, state = _prefill_and_capture(model_path, n_threads, tokens)
        assert_bitwise(ref_logits, logits, f"{model} {length} tokens, {n_threads} vs 2 threads")
        assert state == ref_state, f"{model}: KV bytes differ at {n_threads} threads"


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"n_threads": 1}, {"n_threads": 4}, {"n_ctx": 8192}])
def test_a_library_built_with_2_threads_grafts_under_other_threads_and_a_larger_context(
    small_library, gemma_path, settings
):
    questions = [
        "What is 17 times 23?",
        "A farmer has 3 crates of 24 apples and sells 29 apples. How many apples are left?",
        "Starting from 27, how many steps does the Collatz process take to reach 1?",  # past 512 tokens
    ]
    with GraftEngine(small_library, model_path=str(gemma_path), **{"n_threads": 2, **settings}) as engine:
        for question in questions:
            graft = engine.ask(question, max_tokens=12)
            assert graft.route == "graft", graft.fallback_reason
            rag = engine.ask(question, mode="text-rag", entry_id=graft.entry_id, max_tokens=12)
            assert graft.text == rag.text


def test_an_engine_takes_the_library_s_pinned_settings_and_reports_an_override(small_library, gemma_path, caplog):
    from kvgraft_plugin import Library

    library = Library.open(small_library)
    assert library.fingerprint["type_k"] == "f16"
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2, type_k="q8_0") as engine:
        result = engine.ask("What is 17 times 23?", max_tokens=2)
    assert result.route == "text-rag" and result.fallback_reason.startswith("incompatible")
    assert "rebuild" in result.fallback_reason
    assert any("type_k='q8_0' differs from the library's 'f16'" in r.getMessage() for r in caplog.records)


def test_an_engine_adopts_a_library_built_with_other_pinned_settings(example_entries, gemma_path, tmp_path):
    from kvgraft_plugin.curation.build import build_library

    entries = [e for e in example_entries if e.id == "mul-17x23"]
    with GraftEngine(None, model_path=str(gemma_path), n_threads=2, n_batch=256, n_ubatch=256) as builder:
        build_library(tmp_path / "lib", entries, engine=builder)
    with GraftEngine(tmp_path / "lib", model_path=str(gemma_path), n_threads=2) as engine:  # defaults: 512
        assert engine.config.llama.n_batch == 256
        assert engine.ask("What is 17 times 23?", max_tokens=2).route == "graft"
