"""``kvgraft calibrate``: pick a library's routing threshold from labelled queries.

For each labelled query (``expect_entry``: an entry id, or ``null`` for a near-miss or uncovered
question) the router's candidates and guard verdicts are computed once; a threshold then decides which
candidates are considered. The chosen threshold grafts no query onto a wrong entry (or as few as
possible) and, among those, routes the most covered queries right; ties take the middle of the range.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgraft_plugin.core.exceptions import ConfigError
from kvgraft_plugin.curation.answer_checks import final_number, same_value
from kvgraft_plugin.engine.engine import GraftEngine
from kvgraft_plugin.routing.judge import CLOSE_MARGIN, SMALL_EDIT, JudgeVerdict, clear_yes
from kvgraft_plugin.routing.numerals import written_numbers

__all__ = ["CurvePoint", "RelatedCalibration", "calibrate", "calibrate_judge", "calibrate_related", "labelled_queries"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CurvePoint:
    """Routing outcome at one threshold (a similarity, or with a judge its margin)."""

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


def labelled_queries(engine: GraftEngine, queries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The queries labelled with ``expect_entry`` that can be routed: an empty question is left out (and
    logged); a label naming no entry of the library is a `ConfigError` that lists them, since counting it
    as a wrong graft would bias the chosen threshold."""
    labelled = [q for q in queries if "expect_entry" in q]
    if not labelled:
        raise ConfigError("calibrate needs queries labelled with expect_entry (an entry id or null)")
    entries = engine.library.entries if engine.library is not None else {}
    named = [q for q in labelled if q["expect_entry"] is not None]
    unknown = sorted({str(q["id"]) for q in named if q["expect_entry"] not in entries})
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise ConfigError(f"expect_entry names no entry of the library in queries {shown}")
    empty = [str(q["id"]) for q in labelled if not str(q.get("question") or "").strip()]
    if empty:
        logger.warning("calibrate leaves out %d queries with an empty question (%s)", len(empty), ", ".join(empty[:5]))
    return [q for q in labelled if str(q.get("question") or "").strip()]


def calibrate(engine: GraftEngine, queries: Sequence[Mapping[str, Any]]) -> tuple[CurvePoint, list[CurvePoint]]:
    """The chosen point and the curve it was chosen from (one point per distinct candidate score)."""
    labelled = labelled_queries(engine, queries)
    explained: Explained = [(q.get("expect_entry"), engine.explain(q["question"])) for q in labelled]
    scores = sorted({round(score, 4) for _, cands in explained for _, score, _ in cands} | {0.3, 0.95})
    curve = [_point(explained, threshold) for threshold in scores]
    first, last = _best_range(curve)
    return _point(explained, round((curve[first].threshold + curve[last].threshold) / 2, 4)), curve


def _best_range(curve: Sequence[CurvePoint]) -> tuple[int, int]:
    """The first and last index of the points that graft the fewest wrongly and, among those, the most right."""
    fewest_wrong = min(p.wrong for p in curve)
    best = max(p.right for p in curve if p.wrong == fewest_wrong)
    tied = [i for i, p in enumerate(curve) if p.wrong == fewest_wrong and p.right == best]
    return tied[0], tied[-1]


#: One labelled query with a judge: its expected entry and its candidates (entry id, score, structural
#: refusal or ``None``, judge margin or ``None`` where a guard refused first, why the pair needs a clear Yes
#: or ``None``: `kvgraft_plugin.routing.judge.clear_yes`, the rewording score of a small edit or ``None``:
#: `kvgraft_plugin.routing.rewording`, and whether the numbers a question writes in words read as the
#: entry's, or ``None``: `kvgraft_plugin.routing.numerals`), best first.
Candidates = list[tuple[str, float, str | None, float | None, str | None, float | None, bool | None]]
Judged = list[tuple[str | None, Candidates]]


def _judged_outcome(candidates: Candidates, margin: float) -> str | None:
    """The entry the router would graft at judge threshold ``margin``: the first candidate no guard refused
    whose `JudgeVerdict` passes, the one decision the router takes (the rewording score is read only once
    the margin clears the threshold, as `kvgraft_plugin.routing.judge.Judge` asks it)."""
    for entry_id, _, refusal, judged, clear, rewording, numerals in candidates:
        if refusal is not None or judged is None:
            continue
        bar = CLOSE_MARGIN if clear is not None and margin < CLOSE_MARGIN else margin
        asked = rewording if judged >= margin else None
        if JudgeVerdict(judged, bar, 0.0, cached=True, clear_yes=clear, rewording=asked, numerals=numerals).passed:
            return entry_id
    return None


def _judge_point(judged: Judged, margin: float) -> CurvePoint:
    picks = [(expect, _judged_outcome(cands, margin)) for expect, cands in judged]
    right = sum(1 for expect, got in picks if expect is not None and got == expect)
    wrong = sum(1 for expect, got in picks if got is not None and got != expect)
    return CurvePoint(margin, right, wrong, sum(1 for expect, _ in judged if expect is not None))


def calibrate_judge(
    engine: GraftEngine, queries: Sequence[Mapping[str, Any]], *, judge_model: str, profile: str = "none"
) -> tuple[CurvePoint, list[CurvePoint]]:
    """The judge's margin threshold for ``engine``'s library, and the curve it was chosen from.

    Every candidate above the library's similarity threshold that passes the guards of ``profile`` is judged
    once; the chosen margin grafts the fewest queries wrongly and, among those, the most covered ones right,
    halfway between the margins that bound that range (a margin just above a near-miss's would be a brittle
    choice). A pair that needs a clear Yes (`kvgraft_plugin.routing.judge.clear_yes`) needs `CLOSE_MARGIN` at least,
    as when routing, unless the word guards of ``profile="math"`` passed it, or it is a small edit that the
    rewording check passes (`kvgraft_plugin.routing.rewording`; scored for every small edit, and refusing one read as
    a changed problem even with a clear Yes), or
    the entry with its numbers written in words that read back as its own (`kvgraft_plugin.routing.numerals`)."""
    labelled = labelled_queries(engine, queries)
    # inline: every candidate the structural guards pass is judged now (async would leave it to the word guards)
    config = engine.config.replace(
        judge_model=judge_model, judge_threshold=float("-inf"), profile=profile, judge_mode="inline"
    )

    def explain_all() -> Judged:
        router, judged, library = engine.routing.router(config), engine.routing.judge(config), engine.library
        if router is None or judged is None or library is None:
            raise ConfigError("calibrate needs a library with entries and an index")
        threshold, out = router.threshold, []
        for q in labelled:
            cands = []
            for entry_id, score, refusal in router.explain(q["question"]):
                if score < threshold:
                    break
                margin, rewording, numerals, entry = None, None, None, library.entries[entry_id].entry
                clear = clear_yes(entry.problem, q["question"]) if profile != "math" else None
                if refusal is None:
                    margin = judged[0].margin(entry.problem, q["question"], entry.answer)
                    if written_numbers(entry.problem, q["question"]):
                        numerals = judged[0].numerals(entry.problem, q["question"])
                    if not numerals and clear == SMALL_EDIT:  # as the judge reads a pair (`Judge._missing`)
                        rewording = judged[0].rewording(entry.problem, q["question"])
                cands.append((entry_id, score, refusal, margin, clear, rewording, numerals))
            out.append((q.get("expect_entry"), cands))
        return out

    judged = engine.run_exclusive(lambda _: explain_all())
    margins = sorted({c[3] for _, cands in judged for c in cands if c[3] is not None and c[3] != float("-inf")})
    cuts = [m - 0.01 for m in margins] + [margins[-1] + 0.01] if margins else [0.0]
    curve = [_judge_point(judged, cut) for cut in cuts]
    first, last = _best_range(curve)
    low = margins[first - 1] if margins and first > 0 else cuts[first]  # the highest margin below the range
    high = margins[last] if margins and last < len(margins) else cuts[last]
    return _judge_point(judged, round((low + high) / 2, 3)), curve


@dataclass(frozen=True)
class RelatedCalibration:
    """The ``related`` route measured against plain decoding on the questions it would take (their nearest
    entry at or above ``threshold`` and not the same problem), on the library's model."""

    threshold: float
    asked: int
    """Labelled questions with a numeric answer that the route would take."""
    right: tuple[int, int]
    """Answers whose final number is the question's value: (plain, related)."""
    copied: tuple[int, int]
    """Answers that are wrong and give the nearest entry's value instead: (plain, related)."""
    model: str

    @property
    def on(self) -> bool:
        """More answers right and no more copied: the route earns its place."""
        return self.right[1] > self.right[0] and self.copied[1] <= self.copied[0]

    @property
    def why(self) -> str:
        """The measurement in words."""
        verdict = "on" if self.on else "off"
        return (
            f"{verdict} by calibration on {self.model}: {self.asked} questions, right {self.right[1]} with the "
            f"related entry vs {self.right[0]} plain, the entry's answer copied {self.copied[1]} vs {self.copied[0]}"
        )

    def to_json(self) -> dict[str, Any]:
        """The library's ``routing["related"]`` record."""
        return {
            "on": self.on, "threshold": self.threshold, "model": self.model, "asked": self.asked,
            "right": {"plain": self.right[0], "related": self.right[1]},
            "copied": {"plain": self.copied[0], "related": self.copied[1]}, "why": self.why,
        }  # fmt: skip


def calibrate_related(
    engine: GraftEngine, queries: Sequence[Mapping[str, Any]], *, max_tokens: int = 256
) -> RelatedCalibration:
    """Measure the ``related`` route on ``engine``'s library and model: every labelled question with a numeric
    answer (``value``, else the number in ``answer``) whose route with ``related=True`` is related is asked
    that way and plainly, each answer read as its final number
    (`kvgraft_plugin.curation.answer_checks.final_number`)."""
    library = engine.library
    if library is None:
        raise ConfigError("calibrate --related needs a library")
    labelled = labelled_queries(engine, queries)
    right, copied, asked = [0, 0], [0, 0], 0
    for q in labelled:
        value = q.get("value")
        value = float(value) if isinstance(value, (int, float)) else final_number(str(q.get("answer") or ""))
        if value is None:
            continue
        related = engine.ask(q["question"], routing={"related": True}, max_tokens=max_tokens)
        if related.cue != "related" or related.entry_id is None:
            continue
        answer = library.get(related.entry_id).entry.answer
        theirs = final_number(answer) if answer else None
        plain = engine.ask(q["question"], mode="plain", max_tokens=max_tokens)
        asked += 1
        for i, text in enumerate((plain.text, related.text)):
            got = final_number(text)
            if same_value(got, value):
                right[i] += 1
            elif theirs is not None and not same_value(theirs, value) and same_value(got, theirs):
                copied[i] += 1
    threshold = engine.routing.related(engine.config)[1]
    return RelatedCalibration(threshold, asked, (right[0], right[1]), (copied[0], copied[1]), engine.model_path.name)
