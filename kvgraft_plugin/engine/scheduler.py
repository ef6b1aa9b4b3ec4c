"""Continuous batching: concurrent requests decoded together, each in a sequence of its own.

    stream(request) -> queue -> _loop on the worker:  admit (route, restore or prefill into a free
    sequence, first token)  ->  step (one token for every active sequence in one llama.cpp batch)  ->  retire

A request joins at the next step after a sequence is free and leaves at its stop, so a short answer never
waits for a long one. Each sequence has a KV stream of its own (`LlamaBackend`, ``n_seq``), and its prefill
runs alone, in the chunks it has when served alone. Decoding one token for each of several sequences is
exact only where it was measured so (`SequenceBatch`): there, every answer is bitwise the one a serial
engine gives, route and text. Requests decode step by step here (lookup drafts do not join a batch); the
tokens are the same.

Every llama.cpp call stays on the engine's one worker thread: the loop runs there while any request is
active or waiting, and the callers' threads only read their request's queue.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from kvgraft_plugin.core.backend import Backend, BatchBackend
from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.engine.batch_invariance import SequenceBatch
from kvgraft_plugin.engine.decode import DecodeStats, TextAssembler, Transcript
from kvgraft_plugin.engine.request import Request
from kvgraft_plugin.engine.result import GraftChunk
from kvgraft_plugin.engine.start import Started
from kvgraft_plugin.engine.worker import Worker

__all__ = ["BatchStats", "Scheduler", "batch_scheduler"]

logger = logging.getLogger(__name__)


@dataclass
class BatchStats:
    """What the scheduler did, for ``/metrics``: steps by batch size and the tokens they decoded."""

    steps: collections.Counter[int] = field(default_factory=collections.Counter)
    """Decode steps by the number of sequences in them."""
    tokens: int = 0
    """Tokens decoded in steps."""
    seconds: float = 0.0
    """Time spent in steps."""

    @property
    def tokens_per_second(self) -> float:
        """Decoded tokens per second of stepping (0.0 before the first step)."""
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class _Job:
    request: Request
    config: EngineConfig
    cancel: threading.Event
    items: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)


@dataclass
class _Active:
    seq: int
    job: _Job
    started: Started
    text: TextAssembler
    token: int
    produced: int = 1


class _End:
    """The end of a request's chunks."""


_END = _End()


class Scheduler:
    """Decodes up to ``max_batch`` requests together on ``worker``.

    ``start(request, config)`` routes a request and restores or prefills it into the backend's current
    sequence (`kvgraft_plugin.engine.start.Starter.start_batched`); ``trim`` is the template's.
    """

    def __init__(
        self,
        backend: BatchBackend,
        worker: Worker,
        start: Callable[[Request, EngineConfig, threading.Event], Started],
        *,
        trim: Callable[[str], str],
        max_batch: int,
    ) -> None:
        self._backend, self._worker, self._start, self._trim = backend, worker, start, trim
        self.max_batch = max_batch
        """Sequences decoded together at most."""
        self.stats = BatchStats()
        self._lock = threading.Lock()
        self._waiting: collections.deque[_Job] = collections.deque()
        self._running = False
        self._active: list[_Active] = []
        self._free = list(range(max_batch - 1, -1, -1))

    def stream(self, request: Request, config: EngineConfig, cancel: threading.Event) -> Iterator[GraftChunk]:
        """``request``'s chunks, decoded beside the other active requests; the last carries the result.
        Closing the iterator early cancels the request at its next step."""
        job = _Job(request, config, cancel)
        with self._lock:
            self._waiting.append(job)
            start_loop, self._running = not self._running, True
        if start_loop:
            self._worker.submit(self._loop)
        try:
            while not isinstance(item := job.items.get(), _End):
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()

    # -- on the worker ----------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._active and not self._waiting:
                        self._running = False
                        return
                self._admit()
                if self._active:
                    self._step()
        except BaseException as exc:  # every request in flight learns of it; none waits forever
            logger.exception("the batch scheduler failed")
            with self._lock:
                jobs = [active.job for active in self._active] + list(self._waiting)
                self._waiting.clear()
                self._running = False
            for active in self._active:
                active.started.sampler.close()
            self._active.clear()
            self._free = list(range(self.max_batch - 1, -1, -1))
            for job in jobs:
                job.items.put(exc)
                job.items.put(_END)

    def _admit(self) -> None:
        """Route and prefill waiting requests into free sequences, each alone, and take its first token."""
        while self._free:
            with self._lock:
                if not self._waiting:
                    return
                job = self._waiting.popleft()
            seq = self._free.pop()
            self._backend.use_sequence(seq)
            started = None
            try:
                started = self._start(job.request, job.config, job.cancel)  # cancelled: never routed
                token = started.sampler.sample()
            except Exception as exc:  # this request fails alone, as it would serially
                if started is not None:
                    started.sampler.close()
                self._backend.reset()
                self._free.append(seq)
                job.items.put(exc)
                job.items.put(_END)
                continue
            text = TextAssembler(self._backend, trim=self._trim, stop=started.stop, out=Transcript())
            active = _Active(seq, job, started, text, token)
            self._active.append(active)
            self._take(active)

    def _step(self) -> None:
        """One token for every active sequence, in one batch."""
        t0 = time.perf_counter()
        batch = list(self._active)
        self._backend.decode_batch([(active.seq, active.token) for active in batch])
        for i, active in enumerate(batch):
            active.token = active.started.sampler.sample(i)
            active.produced += 1
        self.stats.steps[len(batch)] += 1
        self.stats.tokens += len(batch)
        self.stats.seconds += time.perf_counter() - t0
        for active in batch:
            self._take(active)

    def _take(self, active: _Active) -> None:
        """Show ``active``'s newest token; retire it at its end, its budget or its cancel."""
        if piece := active.text.push(active.token):
            active.job.items.put(GraftChunk(piece))
        cancelled = active.job.cancel.is_set()
        if active.text.done or cancelled or active.produced >= active.started.limit:
            self._active.remove(active)
            out = active.text.out
            if rest := active.text.finish(cancelled=cancelled):
                active.job.items.put(GraftChunk(rest))
            result = active.started.finish(out, DecodeStats(), "step")
            self._release(active)
            active.job.items.put(GraftChunk("", result))
            active.job.items.put(_END)

    def _release(self, active: _Active) -> None:
        active.started.sampler.close()
        self._backend.use_sequence(active.seq)
        self._backend.reset()
        self._free.append(active.seq)


def batch_scheduler(
    backend: Backend,
    worker: Worker,
    start: Callable[[Request, EngineConfig, threading.Event], Started],
    trim: Callable[[str], str],
    sequences: SequenceBatch,
) -> Scheduler | None:
    """A scheduler for as many of ``backend``'s sequences as are measured bitwise equal decoded together
    (`SequenceBatch`), or ``None``: requests are served one at a time."""
    n_seq = getattr(backend, "n_seq", 1)
    if n_seq < 2:
        return None
    proven = sequences.max_batch
    if proven < 2:
        logger.warning(
            "sequences decoded together are not bitwise equal to each alone on this build and model: "
            "requests are served one at a time (kvgraft doctor)"
        )
        return None
    if proven < n_seq:
        logger.warning("batches of %d sequences are bitwise; of %d they are not: batching %d", proven, n_seq, proven)
    return Scheduler(cast(BatchBackend, backend), worker, start, trim=trim, max_batch=proven)
