"""The LangChain engine pool: shared by reference count, released by garbage collection without deadlock."""

from __future__ import annotations

import threading
import time

from kvgraft_plugin import EngineConfig
from kvgraft_plugin.adapters import langchain as adapter


class FakeEngine:
    def __init__(self, library, config):
        self.closed = False

    def close(self):
        self.closed = True


def test_users_share_an_engine_and_the_last_release_closes_it(monkeypatch):
    monkeypatch.setattr(adapter, "GraftEngine", FakeEngine)
    pool = adapter._EnginePool()
    key, engine = pool.acquire(None, EngineConfig())
    assert pool.acquire(None, EngineConfig()) == (key, engine)
    pool.release(key)
    assert not engine.closed and len(pool) == 1
    pool.release(key)
    assert engine.closed and len(pool) == 0


def test_a_finalizer_that_fires_inside_acquire_does_not_deadlock(monkeypatch):
    """Garbage collection can run a finalizer in any allocation, here while acquire holds the lock."""
    pool = adapter._EnginePool()
    first: list = []

    def make(library, config):
        if first:
            pool.release_later(first[0])  # what a collected instance's finalizer does
        return FakeEngine(library, config)

    monkeypatch.setattr(adapter, "GraftEngine", make)
    key, engine = pool.acquire(None, EngineConfig())
    first.append(key)
    worker = threading.Thread(target=pool.acquire, args=(None, EngineConfig(neighbors=2)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "acquire deadlocked on a release from a finalizer"
    deadline = time.monotonic() + 10
    while not engine.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.closed and len(pool) == 1
