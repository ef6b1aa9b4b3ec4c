"""The engine's one worker thread: every call into the backend, the embedder and torch runs on it.

llama.cpp's and torch's OpenMP pools then always run on the same thread: calling them from many threads
left idle pools spinning and cost 39% of throughput here. Requests run whole and in arrival order, so
concurrent callers get exactly the outputs they would get serially.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["Worker"]

T = TypeVar("T")


class Worker:
    """One thread that runs calls and streams in order. A call made on the thread itself (a tool called
    from inside a request, or a `match_check` hook asking the engine) runs inline instead of queueing
    behind the request that made it, which would wait forever."""

    def __init__(self, name: str = "kvgraft") -> None:
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=self._mark)
        self._waiting = 0  # calls queued and not started, but for `when_idle`'s
        self._lock = threading.Lock()

    def _mark(self) -> None:
        self._thread = threading.current_thread()

    @property
    def on_thread(self) -> bool:
        """Whether the caller is the worker thread."""
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the worker thread, after every request queued before it; its result or its exception."""
        if self.on_thread:
            return fn()
        return self._queue(fn).result()

    def submit(self, fn: Callable[[], object]) -> None:
        """Queue ``fn()`` on the worker thread and return at once (its result is dropped: ``fn`` reports
        through its own channels)."""
        self._queue(fn)

    def when_idle(self, fn: Callable[[], object]) -> None:
        """Queue ``fn()`` for when no other call is waiting: each time its turn comes while one is, it goes to
        the back of the queue again. For background work (a deferred judgement) that must not hold up a
        request; ``fn`` reports through its own channels."""

        def turn() -> None:
            if self._waiting:
                self._pool.submit(turn)
            else:
                fn()

        self._pool.submit(turn)

    def _queue(self, fn: Callable[[], T]) -> Future[T]:
        with self._lock:
            self._waiting += 1

        def run() -> T:
            with self._lock:
                self._waiting -= 1
            return fn()

        return self._pool.submit(run)

    def stream(self, produce: Callable[[], Iterator[T]], cancel: threading.Event) -> Iterator[T]:
        """The items of ``produce()``, made on the worker thread and handed to the caller's as they come.

        An exception raised there is raised here. Closing this iterator early sets ``cancel``, which
        ``produce`` checks at every token."""
        if self.on_thread:
            yield from produce()
            return
        items: queue.SimpleQueue[T | BaseException | _End] = queue.SimpleQueue()

        def run() -> None:
            try:
                for item in produce():
                    items.put(item)
            except BaseException as exc:  # handed to the caller's thread, raised there
                items.put(exc)
            finally:
                items.put(_END)

        self._queue(run)
        try:
            while not isinstance(item := items.get(), _End):
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()

    def close(self, last: Callable[[], None]) -> None:
        """Run ``last`` after every queued request, then stop the thread."""
        try:
            self._queue(last).result()
        except RuntimeError:  # the interpreter is exiting and takes no new work: nothing can be running
            last()
        self._pool.shutdown()


class _End:
    """The end of a stream (``None`` may be an item)."""


_END = _End()
