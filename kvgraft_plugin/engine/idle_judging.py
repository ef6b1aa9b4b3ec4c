"""The asynchronous judge's schedule: deferred pairs (``judge_mode="async"``) are judged on the engine's worker
when no request waits, one at a time, so a judgement never delays a request by more than the one in hand."""

from __future__ import annotations

import logging
import threading

from kvgraft_plugin.engine.worker import Worker
from kvgraft_plugin.library.aliases import Alias
from kvgraft_plugin.routing.library_routing import LibraryRouting

__all__ = ["IdleJudging"]

logger = logging.getLogger(__name__)


class IdleJudging:
    """Judges ``routing``'s deferred pairs on ``worker`` whenever it is idle (`after_request`), or all now
    (`judge_all`); an approval is stored in the library, signed with ``key``."""

    def __init__(self, routing: LibraryRouting, worker: Worker, key: bytes | None) -> None:
        self.routing, self.worker, self.key = routing, worker, key
        self.enabled = True
        """Judge when idle; False leaves the pairs to `judge_all` (``kvgraft ask --queries`` judges after the
        last question)."""
        self.closed = False
        self._queued, self._lock = False, threading.Lock()

    def after_request(self) -> None:
        """Queue the next deferred judgement for when no request is waiting (at most one queued at a time)."""
        with self._lock:
            if self._queued or self.closed or not self.enabled or not self.routing.pending:
                return
            self._queued = True
        self.worker.when_idle(self._judge_one)

    def _judge_one(self) -> None:
        with self._lock:
            self._queued = False
        if self.closed:
            return
        try:
            self.routing.judge_deferred(self.key)
        except Exception:  # background work: a failure is logged, never raised into a request
            logger.exception("a deferred judgement failed")
        self.after_request()

    def judge_all(self) -> list[Alias]:
        """Judge every deferred pair now, on the caller's thread (the worker's); the aliases approved."""
        approved = []
        while self.routing.pending:
            alias = self.routing.judge_deferred(self.key)
            approved += [alias] if alias is not None else []
        return approved
