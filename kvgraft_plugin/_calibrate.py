"""``kvgraft calibrate``: pick a library's routing threshold from labelled queries.

For each labelled query (``expect_entry``: an entry id, or ``null`` for a near-miss or uncovered
question) the router's candidates and guard verdicts are computed once; a threshold then decides which
candidates are considered. The chosen threshold grafts no query onto a wrong entry (or as few as
possible) and, among those, routes the most covered queries right; ties take the middle of the range.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._engine import GraftEngine
from ._exceptions import ConfigError

__all__ = ["CurvePoint", "calibrate"]


@dataclass(frozen=True)
class CurvePoint:
    """Routing outcome at one threshold."""

    threshold: float
    right: int
    """Covered queries routed to their entry."""
    wrong: int
    """Queries routed to an entry they do not ask about (near-miss and uncovered included)."""
    covered: int

    @property
    def recall(self) -> float:
        """Share of covered queries routed right."""
        return self.right / self.covered if self.covered else 0.0


def _outcome(candidates: Sequence[tuple[str, float, str | None]], threshold: float) -> str | None:
    """The entry the router would pick at ``threshold``."""
    for entry_id, score, refusal in candidates:
        if score < threshold:
            return None
        if refusal is None:
            return entry_id
    return None


Explained = list[tuple[str | None, list[tuple[str, float, str | None]]]]


def _point(explained: Explained, threshold: float) -> CurvePoint:
    picks = [(expect, _outcome(cands, threshold)) for expect, cands in explained]
    right = sum(1 for expect, got in picks if expect is not None and got == expect)
    wrong = sum(1 for expect, got in picks if got is not None and got != expect)
    return CurvePoint(threshold, right, wrong, sum(1 for expect, _ in explained if expect is not None))


def calibrate(engine: GraftEngine, queries: Sequence[Mapping[str, Any]]) -> tuple[CurvePoint, list[CurvePoint]]:
    """The chosen point and the curve it was chosen from (one point per distinct candidate score)."""
    labelled = [q for q in queries if "expect_entry" in q]
    if not labelled:
        raise ConfigError("calibrate needs queries labelled with expect_entry (an entry id or null)")
    explained: Explained = [(q.get("expect_entry"), engine.explain(q["question"])) for q in labelled]
    scores = sorted({round(score, 4) for _, cands in explained for _, score, _ in cands} | {0.3, 0.95})
    curve = [_point(explained, threshold) for threshold in scores]
    fewest_wrong = min(p.wrong for p in curve)
    best = max(p.right for p in curve if p.wrong == fewest_wrong)
    tied = [p.threshold for p in curve if p.wrong == fewest_wrong and p.right == best]
    return _point(explained, round((tied[0] + tied[-1]) / 2, 4)), curve
