"""Greedy graft output equals text RAG output, and the fingerprint/integrity guards hold."""

from __future__ import annotations

import shutil

import pytest

from kvgraft_plugin import GraftEngine, Library

QUERIES = {
    "mul-17x23": ["What is 17 times 23?", "Compute 17 multiplied by 23, please, and give only the number."],
    "gcd-84-126": ["gcd?", "What is the greatest common divisor of 84 and 126?"],
    "collatz-27": ["Starting from 27, how many steps does the Collatz process take to reach 1?"],
    "py-int-div": ["What does -7 // 2 give in Python 3, using floor division on negative numbers?"],
}


@pytest.fixture(scope="module")
def lib_engine(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        yield engine


def test_every_example_entry_is_exact(small_library):
    records = Library.open(small_library).entries.values()
    assert {r.fidelity for r in records} == {"exact"}
    assert max(len(r.tokens) for r in records) > 1500  # one entry is far past the 512 window


@pytest.mark.slow
@pytest.mark.parametrize(("entry_id", "question"), [(k, q) for k, qs in QUERIES.items() for q in qs])
def test_graft_text_equals_text_rag_text(lib_engine, entry_id, question):
    graft = lib_engine.ask(question, mode="graft", entry_id=entry_id, max_tokens=24, stop=())
    text_rag = lib_engine.ask(question, mode="text-rag", entry_id=entry_id, max_tokens=24, stop=())
    assert graft.route == "graft" and graft.fallback_reason is None
    assert text_rag.route == "text-rag" and text_rag.fallback_reason is None
    assert graft.text == text_rag.text and graft.decode_tokens == text_rag.decode_tokens
    assert graft.restored_tokens == len(lib_engine.library.get(entry_id).tokens)
    assert graft.prefill_tokens < text_rag.prefill_tokens
    assert text_rag.prefill_tokens == graft.prefill_tokens + graft.restored_tokens


def test_covered_problem_is_answered_in_few_tokens(lib_engine):
    graft = lib_engine.ask("What is 17 times 23?", mode="graft", entry_id="mul-17x23")
    assert graft.text == "391" and graft.decode_tokens <= 6


def _copy(src, tmp_path):
    dst = tmp_path / "lib"
    shutil.copytree(src, dst)
    return dst


def test_state_from_another_model_is_refused(small_library, smol_path, tmp_path):
    with GraftEngine(_copy(small_library, tmp_path), model_path=str(smol_path), n_threads=2) as engine:
        result = engine.ask("What is 17 times 23?", mode="graft", entry_id="mul-17x23")
    assert result.route == "text-rag" and result.fallback_reason.startswith("incompatible")
    assert "gguf_sha256" in result.fallback_reason


def test_state_with_another_type_k_is_refused(small_library, gemma_path, tmp_path):
    with GraftEngine(_copy(small_library, tmp_path), model_path=str(gemma_path), n_threads=2, type_k="q8_0") as engine:
        result = engine.ask("What is 17 times 23?", mode="graft", entry_id="mul-17x23")
    assert result.route == "text-rag" and result.fallback_reason.startswith("incompatible")
    assert "type_k" in result.fallback_reason


def test_damaged_state_never_reaches_llama_cpp(small_library, gemma_path, tmp_path, monkeypatch):
    lib = _copy(small_library, tmp_path)
    record = Library.open(lib).get("gcd-84-126")
    path = lib / record.state_file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit in the KV bytes
    path.write_bytes(bytes(data))
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2) as engine:
        calls = []
        monkeypatch.setattr(engine.backend, "restore_state", lambda *a: calls.append(a))
        result = engine.ask("What is the greatest common divisor of 84 and 126?", mode="graft", entry_id="gcd-84-126")
    assert calls == []
    assert result.route == "text-rag" and result.fallback_reason.startswith("integrity")
    assert result.text == "42"
