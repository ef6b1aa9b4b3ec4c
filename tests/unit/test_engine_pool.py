"""The LangChain engine pool: shared by reference count, released by garbage collection without deadlock;
only the settings a caller set reach the engine (the library's pinned ones fill the rest)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from kvgraft_plugin.adapters import langchain as adapter
from kvgraft_plugin.adapters.langchain import ChatKVGraft, KVGraftLLM, KVGraftRetriever
from kvgraft_plugin.library.index import Hit
from kvgraft_plugin.library.template import Entry


class FakeEngine:
    """What the pool builds: records how it was called; a one-entry library to search."""

    made: list[FakeEngine] = []

    def __init__(self, library, config=None, **settings):
        self.library_arg, self.config, self.settings = library, config, settings
        self.closed = False
        entry = Entry("mul", "What is 17 times 23?", "17 * 23 = 391", "391")
        self.library = SimpleNamespace(entries={"mul": SimpleNamespace(entry=entry)})
        FakeEngine.made.append(self)

    def search(self, question, k=None):
        return [Hit("mul", 0.9), Hit("pruned", 0.8)][:k]

    def close(self):
        self.closed = True


@pytest.fixture
def pool(monkeypatch):
    FakeEngine.made = []
    monkeypatch.setattr(adapter, "GraftEngine", FakeEngine)
    fresh = adapter._EnginePool()
    monkeypatch.setattr(adapter, "_POOL", fresh)
    return fresh


def test_users_share_an_engine_and_the_last_release_closes_it(pool):
    key, engine = pool.acquire(None, {})
    assert pool.acquire(None, {}) == (key, engine)
    pool.release(key)
    assert not engine.closed and len(pool) == 1
    pool.release(key)
    assert engine.closed and len(pool) == 0


def test_a_finalizer_that_fires_inside_acquire_does_not_deadlock(monkeypatch):
    """Garbage collection can run a finalizer in any allocation, here while acquire holds the lock."""
    pool = adapter._EnginePool()
    first: list = []

    def make(library, **settings):
        if first:
            pool.release_later(first[0])  # what a collected instance's finalizer does
        return FakeEngine(library, **settings)

    monkeypatch.setattr(adapter, "GraftEngine", make)
    key, engine = pool.acquire(None, {})
    first.append(key)
    worker = threading.Thread(target=pool.acquire, args=(None, {"n_threads": 2}), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "acquire deadlocked on a release from a finalizer"
    deadline = time.monotonic() + 10
    while not engine.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed and len(pool) == 1


def test_only_the_settings_a_caller_set_reach_the_engine(pool, tmp_path):
    """A config would pin every llama setting to its default, and the engine would not adopt the library's
    (a library built with n_batch=256 then fell back to text RAG on every LangChain call)."""
    lib = str(tmp_path / "lib")
    chat = ChatKVGraft(library=lib, model="gemma3-270m", n_threads=2, temperature=0.5, threshold=0.7)
    engine = chat._get_engine()
    assert engine.config is None and engine.library_arg == lib
    assert engine.settings == {"model_path": "gemma3-270m", "n_threads": 2}  # no routing, no sampling
    # an explicit default is another engine than an unset one: the unset one takes the library's value
    held = ChatKVGraft(library=lib, model="gemma3-270m", n_threads=2, n_batch=512)
    explicit = held._get_engine()
    assert explicit is not engine and explicit.settings["n_batch"] == 512
    llm = KVGraftLLM(library=lib, model_path="gemma3-270m", n_threads=2, max_tokens=3)
    assert llm._get_engine() is engine and len(pool) == 2


def test_the_retriever_searches_through_the_pooled_engine(pool, tmp_path):
    """Its cache_dir and key_file reach the engine (whose search gives out nothing from an untrusted
    library), and a chat model with the same settings shares the engine."""
    lib, cache = str(tmp_path / "lib"), str(tmp_path / "cache")
    settings = {"library": lib, "cache_dir": cache, "key_file": "k.bin", "n_threads": 2}
    retriever = KVGraftRetriever(**settings, k=2)
    docs = retriever.invoke("What is 17 times 23?")
    engine = retriever._get_engine()
    assert engine.settings == {"cache_dir": cache, "key_file": "k.bin", "n_threads": 2}
    chat = ChatKVGraft(**settings)
    assert chat._get_engine() is engine and len(pool) == 1
    assert [(d.page_content, d.metadata) for d in docs] == [  # "pruned" is not in the manifest: skipped
        (
            "Problem: What is 17 times 23?\nAnswer: 391\nSolution: 17 * 23 = 391",
            {"entry_id": "mul", "score": 0.9, "problem": "What is 17 times 23?", "answer": "391"},
        )
    ]
    retriever.release()
    assert not engine.closed  # the chat model still uses it
    chat.release()
    assert engine.closed and len(pool) == 0
