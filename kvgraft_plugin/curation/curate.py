"""``kvgraft curate``: stash the frozen model's own verified solutions as library entries.

Each problem is sampled up to N times with the plain template (no library), one fixed seed per attempt,
with `CURATE_SAMPLING` unless told otherwise: top-p and min-p keep the attempts off the vocabulary's tail.
The first answer the checker accepts against the known answer becomes the entry's solution. A problem
solved once, at whatever cost, is then answered by a graft every time after.

With ``--checker tests`` (the default for a problem without an answer) each problem's ``tests`` run against
each attempt: always, since they are the check, and contained (`kvgraft_plugin.curation.answer_checks.run_tests`: a
temporary folder, no network, no new process, resource limits), since they are code from the problems'
author.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvgraft_plugin.core.sampling import CURATE_SAMPLING, SamplingParams
from kvgraft_plugin.core.statefile import atomic_write
from kvgraft_plugin.curation.answer_checks import Checker
from kvgraft_plugin.engine.engine import GraftEngine
from kvgraft_plugin.library.library import read_jsonl
from kvgraft_plugin.library.template import Entry

__all__ = ["CurateReport", "curate", "read_problems"]


@dataclass
class CurateReport:
    """Per problem: attempts made, successes, tokens spent, and whether an entry was written."""

    id: str
    attempts: int
    successes: int
    decode_tokens: int
    prefill_tokens: int
    kept: bool


def read_problems(path: str | Path) -> list[dict[str, Any]]:
    """``{"id", "problem", "answer"?, "tests"?}`` per line (an answer or tests to check against); errors name
    the line."""
    return [row for _, row in read_jsonl(path, _parse_problem, what="problems", items="problems")]


def _parse_problem(row: Any) -> dict[str, Any]:
    if not (
        isinstance(row, dict)
        and all(isinstance(row.get(k), str) and row[k].strip() for k in ("id", "problem"))
        and any(isinstance(row.get(k), str) and row[k].strip() for k in ("answer", "tests"))
    ):
        raise ValueError('expected {"id", "problem"} and an "answer" or "tests" string')
    return row


def curate(
    engine: GraftEngine,
    problems: list[dict[str, Any]],
    out: Path,
    *,
    attempts: int,
    checker: Checker,
    sampling: SamplingParams = CURATE_SAMPLING,
    stop_at_first: bool = True,
    progress: Callable[[int], Any] | None = None,
) -> list[CurateReport]:
    """Sample, verify, and write a library source of the verified solutions to ``out``.

    Attempt ``i`` samples with ``sampling`` and seed ``sampling.seed + i``, so a rerun makes the same
    attempts."""
    entries: list[Entry] = []
    reports: list[CurateReport] = []
    for problem in problems:
        question = {**problem, "question": problem["problem"]}
        kept: str | None = None
        report = CurateReport(problem["id"], 0, 0, 0, 0, False)
        for attempt in range(attempts):
            result = engine.ask(problem["problem"], mode="plain", sampling=sampling, seed=sampling.seed + attempt)
            report.attempts += 1
            report.decode_tokens += result.decode_tokens
            report.prefill_tokens += result.prefill_tokens
            if checker(question, result.text):
                report.successes += 1
                kept = kept or result.text
                if stop_at_first:
                    break
        if kept is not None:
            answer, tests = problem.get("answer"), problem.get("tests")
            entries.append(Entry(problem["id"], problem["problem"], kept, answer, ("curated",), tests))
            report.kept = True
        reports.append(report)
        if progress is not None:
            progress(1)
    atomic_write(out, "".join(json.dumps(e.to_json(), ensure_ascii=False) + "\n" for e in entries))
    return reports


def report_rows(reports: list[CurateReport]) -> list[dict[str, Any]]:
    """Reports as JSON rows."""
    return [asdict(r) for r in reports]
