"""Answer extraction and checking, shared by `build` (entry verification), `bench` and `curate`.

Extraction rule: the final answer is the text after the last ``Answer:`` if there is one, else the
first line of the output. Normalisation lower-cases, drops surrounding spaces, a trailing period,
``$`` and thousands separators. Two answers match when their normalised forms are equal, or when both
parse as numbers and are equal (so ``"391"`` matches ``"391.0"``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ._config import import_callable
from ._template import Entry

__all__ = ["Checker", "default_check", "entry_problems", "extract_answer", "load_checker", "normalize_answer"]

Checker = Callable[[Mapping[str, Any], str], bool]
_NUMBER = re.compile(r"^[-+]?\d+(\.\d+)?$")


def normalize_answer(text: str) -> str:
    """Canonical form of an answer for comparison."""
    text = text.strip().lower().rstrip(".").strip()
    text = text.replace("$", "")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    return " ".join(text.split())


def extract_answer(text: str) -> str:
    """The final answer in a model output (see the module docstring for the rule)."""
    if "Answer:" in text:
        text = text.rsplit("Answer:", 1)[1]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def answers_match(got: str, expected: str) -> bool:
    """Normalised or numeric equality."""
    a, b = normalize_answer(got), normalize_answer(expected)
    if a == b:
        return True
    if _NUMBER.match(a) and _NUMBER.match(b):
        return float(a) == float(b)
    return False


def default_check(question: Mapping[str, Any], text: str) -> bool:
    """The default checker: the extracted answer matches ``question["answer"]``."""
    return answers_match(extract_answer(text), str(question["answer"]))


def load_checker(spec: str | None) -> Checker:
    """``module:function`` to a checker, or the default one."""
    if not spec:
        return default_check
    return import_callable(spec, "--checker")


def entry_problems(entry: Entry) -> list[str]:
    """Why an entry fails verification (empty when it passes or has no answer to check).

    The stated answer must appear in the solution, as a whole word or number.
    """
    if entry.answer is None:
        return []
    answer = normalize_answer(entry.answer)
    solution = normalize_answer(entry.solution.replace(",", ""))
    pattern = r"(?<![\w.-])" + re.escape(answer.replace(",", "")) + r"(?![\w]|\.\d)"  # "4" is not in "-4"
    if not re.search(pattern, solution):
        return [f"answer {entry.answer!r} does not appear in the solution"]
    return []
