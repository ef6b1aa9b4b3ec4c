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

    from kvgraft_plugin.routing.library_routing import LibraryRouting

    monkeypatch.setattr(LibraryRouting, "warm_up", broken_warm_up)
    before = {t for t in threading.enumerate() if t.name.startswith("kvgraft")}
    with pytest.raises(RuntimeError, match="warm-up failed"):
        GraftEngine(small_library, model_path=str(gemma_path), n_threads=2)
    after = {t for t in threading.enumerate() if t.name.startswith("kvgraft") and t.is_alive()}
    assert after <= before


def test_tools_call_the_backend_on_the_worker_thread_only(example_entries, gemma_path, tmp_path):
    """build, verify, calibrate and bench-graft go through the engine's public API, which runs on its worker."""
    from kvgraft_plugin.curation.build import build_library
    from kvgraft_plugin.curation.verify import verify_library
    from kvgraft_plugin.tools.bench_graft import exactness_sweep
    from kvgraft_plugin.tools.calibrate import calibrate

    entries = [e for e in example_entries if e.id in ("mul-17x23", "gcd-84-126")]
    threads: set[str] = set()

    def record(engine: GraftEngine) -> None:
        backend = engine.backend
        for name in ("tokenize", "prefill", "capture_state", "restore_state", "reset"):
            method = getattr(backend, name)

            def wrapped(*args, _method=method, **kwargs):
                threads.add(threading.current_thread().name)
                return _method(*args, **kwargs)

            setattr(backend, name, wrapped)

    with GraftEngine(None, model_path=str(gemma_path), n_threads=2) as engine:
        record(engine)
        build_library(tmp_path / "lib", entries, engine=engine)
        assert all(case["exact"] for case in exactness_sweep(engine, n_cases=2, max_prefix=80))
    with GraftEngine(tmp_path / "lib", model_path=str(gemma_path), n_threads=2) as engine:
        record(engine)
        assert all(row.ok for row in verify_library(engine, fidelity=True))
        calibrate(engine, [{"question": QUESTION, "expect_entry": "mul-17x23"}])
    assert threads and all(name.startswith("kvgraft") for name in threads), threads
