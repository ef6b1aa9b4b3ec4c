"""Aliases: questions a judge approved as an entry's problem, kept in the library, and the judge that defers.

A judgement costs about a second on 2 cores. Krites (Apple, 2026) takes it off the critical path of a semantic
cache: a near-threshold match is not waited for; it is judged later, and an approved one is promoted. Here,
with ``judge_mode="async"``, a candidate whose verdict is not known yet is refused at once (the request is
answered without the entry, as a refusal would be) and the pair is queued (`DeferredJudge`). The engine judges
the queue when its worker is idle; an approved pair becomes an `Alias` of the entry, stored in the library's
manifest (signed with it) with the judge's margin and model. The next time that question is asked it grafts
with no judgement, here and in every process that opens the library.

An alias is matched on the question's exact text (Unicode NFKC, runs of whitespace as one space): a reworded
question is a new pair for the judge, never an alias's neighbour. It holds only while its entry's text is the
text that was judged (``entry_sha256``); `kvgraft aliases` lists and revokes them.
"""

from __future__ import annotations

import logging
import math
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from ._judge import JudgeVerdict

__all__ = ["Alias", "DeferredJudge", "alias_key", "parse_aliases", "parse_revoked"]

logger = logging.getLogger(__name__)


def alias_key(question: str) -> str:
    """The text an alias is matched on: NFKC, stripped, each run of whitespace one space (case is kept: "US"
    is not "us")."""
    return " ".join(unicodedata.normalize("NFKC", question).split())


@dataclass(frozen=True)
class Alias:
    """A question the judge approved as the same problem as entry ``entry_id``."""

    question: str
    entry_id: str
    entry_sha256: str
    """`kvgraft_plugin._library.source_sha256` of the entry that was judged: a changed entry drops its aliases."""
    margin: float
    """The judge's Yes-minus-No margin for the pair."""
    threshold: float
    """The margin it needed."""
    judge: str
    """The judge model's name."""
    prompt: str
    """The judge prompt's name (`kvgraft_plugin._judge.JUDGE_PROMPT`)."""
    score: float
    """The question's cosine similarity to the entry when it was judged (reported as a match's score)."""
    added: str
    """When it was approved (ISO 8601, UTC)."""
    rewording: float | None = None
    """The rewording check's score, for a small edit it read (`kvgraft_plugin._rewording`)."""
    numerals: bool | None = None
    """Whether the numbers the question writes in words read as the entry's (`kvgraft_plugin._numerals`), for a
    question that changes nothing else."""

    @property
    def key(self) -> str:
        """The text it matches (`alias_key`)."""
        return alias_key(self.question)

    @property
    def reason(self) -> str:
        """The alias in words, for the router's trail."""
        if self.numerals:
            why = f"margin {self.margin:+.2f}, its numbers in words read as the entry's digits"
        elif self.rewording is not None:
            why = f"margin {self.margin:+.2f}, read as a rewording: {self.rewording:+.2f}"
        else:
            why = f"margin {self.margin:+.2f} >= {self.threshold:+.2f}"
        return f"alias: judged the same problem by {self.judge} ({why})"

    def to_json(self) -> dict[str, Any]:
        """JSON form, as stored in the manifest."""
        return asdict(self)


def parse_aliases(data: Any, entry_ids: Mapping[str, Any]) -> dict[str, Alias]:
    """The manifest's ``aliases`` list, keyed by `alias_key`; a malformed one raises ``ValueError``, one whose
    entry is gone is dropped (it would never be routed)."""
    if data is None:
        return {}
    if not isinstance(data, list):
        raise ValueError("'aliases' must be a list")
    out: dict[str, Alias] = {}
    for item in data:
        if not isinstance(item, dict):
            raise ValueError(f"an alias must be an object, got {item!r}")
        try:
            alias = Alias(
                question=str(item["question"]), entry_id=str(item["entry_id"]), entry_sha256=str(item["entry_sha256"]),
                margin=float(item["margin"]), threshold=float(item["threshold"]), judge=str(item["judge"]),
                prompt=str(item["prompt"]), score=float(item["score"]), added=str(item["added"]),
                rewording=None if item.get("rewording") is None else float(item["rewording"]),
                numerals=_optional_bool(item.get("numerals")),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed alias {item!r}: {exc}") from exc
        scores = (alias.margin,) if alias.rewording is None else (alias.margin, alias.rewording)
        if not alias.key or not all(math.isfinite(score) for score in scores):
            raise ValueError(f"malformed alias {item!r}")
        if alias.entry_id in entry_ids:
            out[alias.key] = alias
    return out


def parse_revoked(data: Any) -> dict[str, str]:
    """The manifest's ``revoked`` list (``[{"question", "entry_id"}]``) as `alias_key` -> entry id; a malformed
    one raises ``ValueError``."""
    if data is None:
        return {}
    if not isinstance(data, list):
        raise ValueError("'revoked' must be a list")
    out: dict[str, str] = {}
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            raise ValueError(f"malformed revocation {item!r}")
        if not isinstance(item.get("entry_id"), str):
            raise ValueError(f"malformed revocation {item!r}")
        out[alias_key(item["question"])] = item["entry_id"]
    return out


def _optional_bool(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"expected true, false or null, got {value!r}")
    return value


class JudgeLike(Protocol):
    """What `DeferredJudge` needs of a judge (`kvgraft_plugin._judge.Judge`)."""

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
        judge: the real judge (`kvgraft_plugin._judge.Judge`); its cache (``known``) is the memory of what was
            judged.
        threshold: the margin a pair needs.
        vouched: the word guards passed every pair it is asked (``profile="math"``): no pair needs a clear Yes
            (`kvgraft_plugin._judge.pair_bar`).
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
