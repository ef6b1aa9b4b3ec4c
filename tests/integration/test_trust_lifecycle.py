"""Trust holes and the engine's lifecycle: an untrusted library gives out no text, a refused restore falls
back, close() is idempotent, a failed constructor leaks nothing."""

from __future__ import annotations

import shutil
import threading

import pytest
from click.testing import CliRunner

from kvgraft_plugin import BackendError, EngineClosedError, GraftEngine, Library
from kvgraft_plugin.cli import main

QUESTION = "What is 17 times 23?"


@pytest.fixture
def unsigned_with_key(small_library, tmp_path):
    lib = tmp_path / "lib"
    shutil.copytree(small_library, lib)
    key = tmp_path / "key"
    assert CliRunner().invoke(main, ["keygen", str(key)]).exit_code == 0
    return lib, key


def test_an_untrusted_library_gives_out_no_text_however_it_was_opened(unsigned_with_key, gemma_path):
    from kvgraft_plugin.adapters.langchain import KVGraftRetriever

    lib, key = unsigned_with_key
    for library in (lib, Library.open(lib)):
        with GraftEngine(library, model_path=str(gemma_path), n_threads=2, key_file=str(key)) as engine:
            assert engine.search(QUESTION) == []
            assert KVGraftRetriever(engine=engine).invoke(QUESTION) == []
            result = engine.ask(QUESTION, max_tokens=2)
            assert result.route == "plain" and result.fallback_reason.startswith("unsigned")


def test_a_restore_that_llama_cpp_refuses_falls_back_and_leaves_the_cache(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        expected = engine.ask(QUESTION, max_tokens=6)
        assert expected.route == "graft" and engine.state_cache.cache_size > 0
        restore = engine.backend.restore_state

        def refuse(payload, n_tokens):
            raise BackendError("llama_state_seq_set_data read 0 bytes")

        engine.backend.restore_state = refuse  # type: ignore[method-assign]
        refused = engine.ask(QUESTION, max_tokens=6)
        assert refused.route == "text-rag" and "llama.cpp refused" in refused.fallback_reason
        assert refused.text == expected.text and engine.state_cache.cache_size == 0
        engine.backend.restore_state = restore  # type: ignore[method-assign]
        assert engine.ask(QUESTION, max_tokens=6).route == "graft"


def test_close_is_idempotent_and_later_calls_fail_clearly(gemma_path):
    engine = GraftEngine(None, model_path=str(gemma_path), n_threads=2)
    with engine:
        engine.close()
    engine.close()
    for call in (lambda: engine.ask(QUESTION), lambda: list(engine.stream(QUESTION)), lambda: engine.search(QUESTION)):
        with pytest.raises(EngineClosedError, match="closed"):
            call()


def test_a_failed_constructor_leaks_no_worker(small_library, gemma_path, monkeypatch):
    def broken_warm_up(self):
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(GraftEngine, "_warm_up", broken_warm_up)
    before = {t for t in threading.enumerate() if t.name.startswith("kvgraft")}
    with pytest.raises(RuntimeError, match="warm-up failed"):
        GraftEngine(small_library, model_path=str(gemma_path), n_threads=2)
    after = {t for t in threading.enumerate() if t.name.startswith("kvgraft") and t.is_alive()}
    assert after <= before
