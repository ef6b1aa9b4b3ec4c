"""The judge that defers: a pair it has not judged is refused now and judged when the engine is idle.

A judgement costs about a second on 2 cores. Krites (Apple, 2026) takes it off the critical path of a semantic
cache: a near-threshold match is not waited for; it is judged later, and an approved one is promoted. Here,
with ``judge_mode="async"``, a candidate whose verdict is not known yet is refused at once (the request is
answered without the entry, as a refusal would be) and the pair is queued (`DeferredJudge`). The engine judges
the queue when its worker is idle; an approved pair becomes an `Alias` of the entry
(`kvgraft_plugin.library.aliases`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Protocol

from kvgraft_plugin.library.aliases import Alias
from kvgraft_plugin.routing.judge import JudgeVerdict

__all__ = ["DeferredJudge", "JudgeLike"]

logger = logging.getLogger(__name__)


class JudgeLike(Protocol):
    """What `DeferredJudge` needs of a judge (`kvgraft_plugin.routing.judge.Judge`)."""

    def __call__(
        self, problem: str, question: str, *, answer: str | None, threshold: float, vouched: bool = False
    ) -> JudgeVerdict:
        """The verdict on one pair, computed if need be."""
        ...

    def known(
        self, problem: str, question: str, answer: str | None, threshold: float, *, vouched: bool = False
    ) -> JudgeVerdict | None:
        """The verdict at ``threshold`` of a pair already judged far enough to decide it, else ``None``."""
        ...


class DeferredJudge:
    """A judge that does not make the caller wait: a pair it has not judged is refused now and judged later.

    Args:
        judge: the real judge (`kvgraft_plugin.routing.judge.Judge`); its cache (``known``) is the memory of what was
            judged.
        threshold: the margin a pair needs.
        vouched: the word guards passed every pair it is asked (``profile="math"``): no pair needs a clear Yes
            (`kvgraft_plugin.routing.judge.pair_bar`).
        capacity: pairs waiting at most; beyond it the oldest is dropped (it is queued again when asked again).
    """

    def __init__(
        self,
        judge: JudgeLike,
        threshold: float,
        *,
        vouched: bool = False,
        capacity: int = 256,
    ) -> None:
        self.judge, self.threshold, self.vouched, self.capacity = judge, threshold, vouched, capacity
        self._pending: OrderedDict[tuple[str, str], tuple[Any, float]] = OrderedDict()

    def __call__(self, entry: Any, question: str, score: float) -> JudgeVerdict:
        """The verdict on ``entry`` (an `Entry`) for ``question`` if known, else a refusal that queues the pair."""
        known = self.judge.known(entry.problem, question, entry.answer, self.threshold, vouched=self.vouched)
        if known is not None:
            return known
        key = (entry.id, question)
        self._pending[key] = (entry, score)
        self._pending.move_to_end(key)
        if len(self._pending) > self.capacity:
            self._pending.popitem(last=False)
        return JudgeVerdict(math.nan, self.threshold, 0.0, cached=False, error="pending", deferred=True)

    @property
    def pending(self) -> int:
        """Pairs waiting for a verdict."""
        return len(self._pending)

    def clear(self) -> None:
        """Forget the waiting pairs (their judge may not approve any)."""
        self._pending.clear()

    def judge_next(self, *, model: str, prompt: str, entry_sha256: Callable[[Any], str]) -> Alias | None:
        """Judge the oldest waiting pair now (on the caller's thread: the engine's worker); an `Alias` if it
        passed, else ``None``."""
        if not self._pending:
            return None
        (_, question), (entry, score) = self._pending.popitem(last=False)
        verdict = self.judge(
            entry.problem, question, answer=entry.answer, threshold=self.threshold, vouched=self.vouched
        )
        logger.info("deferred judgement of %r for %s: %s (%.0f ms)", question, entry.id, verdict.reason, verdict.ms)
        if not verdict.passed:
            return None
        added = datetime.fromtimestamp(time.time(), tz=timezone.utc).isoformat(timespec="seconds")
        return Alias(
            question, entry.id, entry_sha256(entry), verdict.margin, verdict.threshold, model, prompt, score, added,
            rewording=verdict.rewording, numerals=verdict.numerals,
        )  # fmt: skip
