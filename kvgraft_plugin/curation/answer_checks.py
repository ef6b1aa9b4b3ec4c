"""Answer extraction and checking, shared by `build` (entry verification), `bench` and `curate`.

Code is checked by running tests: `run_tests` (`kvgraft_plugin.curation.sandbox`) executes a program in a fresh,
contained interpreter, the standard library only, because a source's tests are code; `tests_checker`
(``--checker tests``) runs the expected entry's tests against the produced code under the function name the
query asks for.

Code is taken out of an instruct model's answer first (`extract_code`): a fenced block, else the asked
function's last ``def``.

Extraction rule: the final answer is the text after the last ``Answer:`` if there is one, else the
first line of the output. Normalisation lower-cases, drops surrounding spaces, a trailing period,
``$`` and thousands separators. Two answers match when their normalised forms are equal, or when both
parse as numbers and are equal (so ``"391"`` matches ``"391.0"``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kvgraft_plugin.core.config import import_callable
from kvgraft_plugin.curation.sandbox import run_tests
from kvgraft_plugin.library.template import Entry

if TYPE_CHECKING:
    from kvgraft_plugin.library.library import Library

__all__ = [
    "Checker",
    "default_check",
    "entry_problems",
    "extract_answer",
    "extract_code",
    "final_number",
    "same_value",
    "library_tests_checker",
    "load_checker",
    "normalize_answer",
    "run_tests",
    "tests_checker",
]

_DEF = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)
#: Code that stands on its own (a function or module written out), not a body continuing a prompt: it starts
#: at the first column, so an indented body that starts with ``import`` is still a body.
_COMPLETE = re.compile(r"\n*(def|async def|import|from|class|@)\b")
#: A fenced Markdown code block; the closing fence may be missing at the end of the text (a cut answer).
_FENCED = re.compile(r"^[ \t]*```[\w+-]*[ \t]*\n(.*?)(?:^[ \t]*```|\Z)", re.MULTILINE | re.DOTALL)

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


#: A number as solutions write it: a sign, digits with ``,`` or ``.`` or a thin space between groups, a decimal part;
#: not an exponent (the 3 of ``141.3 m^3``).
_WRITTEN_NUMBER = re.compile(r"(?<![\d^])[-−]?\d+(?:[ \u202f]\d{3})*(?:[.,]\d+)*")


def final_number(text: str) -> float | None:
    """The number a worked solution ends on: the first one after its last ``Answer:`` if it has one, else its
    last number (``None``: no number). ``1,200`` and ``1 200`` are twelve hundred; ``10,55`` and ``10.55`` are
    the same decimal (a comma before other than three digits, or after ``0``, or after a point, is a decimal
    comma)."""
    if "Answer:" in text:
        after = _WRITTEN_NUMBER.findall(text.rsplit("Answer:", 1)[1])
        numbers = after[:1] or _WRITTEN_NUMBER.findall(text)
    else:
        numbers = _WRITTEN_NUMBER.findall(text)
    return _number(numbers[-1]) if numbers else None


def same_value(got: float | None, value: float) -> bool:
    """``got`` is ``value`` to the precision a worked answer states (cents, or 0.1% of the value)."""
    return got is not None and abs(got - value) <= max(0.005, 1e-3 * abs(value))


def _number(written: str) -> float | None:
    digits = written.replace("−", "-").replace(" ", "").replace("\u202f", "")
    if "," in digits and "." in digits:  # the later mark is the decimal one
        digits = (
            digits.replace(",", "")
            if digits.rfind(".") > digits.rfind(",")
            else digits.replace(".", "").replace(",", ".")
        )
    elif "," in digits:  # thousands only as groups of three after 1 to 3 leading digits, not "0"
        head, *groups = digits.lstrip("-").split(",")
        thousands = all(len(g) == 3 for g in groups) and 1 <= len(head) <= 3 and head != "0"
        digits = digits.replace(",", "" if thousands else ".")
    try:
        return float(digits)
    except ValueError:  # two decimal points ("1.2.3"): not one number
        return None


def default_check(question: Mapping[str, Any], text: str) -> bool:
    """The default checker: the extracted answer matches ``question["answer"]``."""
    return answers_match(extract_answer(text), str(question["answer"]))


def load_checker(spec: str | None, library: Library | None = None) -> Checker:
    """``module:function`` to a checker; ``"tests"`` for `library_tests_checker`; else the default one."""
    if not spec:
        return default_check
    if spec == "tests":
        return library_tests_checker(library)
    return import_callable(spec, "--checker")


def library_tests_checker(library: Library | None) -> Checker:
    """``--checker tests``: a query's own ``tests``, else its expected entry's in ``library``, run against the
    produced code."""

    def tests_for(query: Mapping[str, Any]) -> tuple[str, str] | None:
        if query.get("tests"):
            return str(query["question"]), str(query["tests"])
        if library is None or query.get("expect_entry") is None:
            return None
        entry = library.get(query["expect_entry"]).entry
        return (entry.problem, entry.tests) if entry.tests else None

    return tests_checker(tests_for)


def extract_code(text: str, name: str | None = None) -> str:
    """The code in a model's answer, as instruct models write it: the last fenced block (```` ``` ````) that
    defines ``name`` (else the last fenced block); without a fence, the last complete ``def name(`` and
    what follows it up to the next unindented line; else the text as it is (a body continuing a prompt)."""
    blocks = [m.group(1) for m in _FENCED.finditer(text)]
    if blocks:
        defining = [b for b in blocks if name and re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", b, re.M)]
        return (defining or blocks)[-1]
    starts = [m.start() for m in _DEF.finditer(text) if name is None or m.group(1) == name]
    if not starts or _COMPLETE.match(text):
        return text
    lines = text[starts[-1] :].splitlines()
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() and not line[0].isspace()), len(lines))
    return "\n".join(lines[:end])


def code_program(prompt: str, text: str, tests: str, *, tested_name: str | None) -> str:
    """The program that tests ``text`` written for ``prompt``: its code (`extract_code`), a complete function
    as is, else the prompt continued by it; then ``tested_name = <asked name>`` when the tests call another
    name."""
    asked = _DEF.search(prompt)
    text = extract_code(text, asked.group(1) if asked else None)
    complete = _COMPLETE.match(text) is not None
    code = text if complete else f"{prompt.rstrip()}\n{text}"
    alias = ""
    if tested_name and asked and asked.group(1) != tested_name:
        alias = f"\n{tested_name} = {asked.group(1)}\n"
    return f"{code}\n{alias}\n{tests}\n"


def tests_checker(tests_for: Callable[[Mapping[str, Any]], tuple[str, str] | None]) -> Checker:
    """``--checker tests``: ``tests_for(query)`` gives (the entry's problem, its tests), or ``None`` (fail)."""

    def check(query: Mapping[str, Any], text: str) -> bool:
        found = tests_for(query)
        if found is None:
            return False
        problem, tests = found
        tested = _DEF.search(problem)
        program = code_program(str(query["question"]), text, tests, tested_name=tested.group(1) if tested else None)
        return run_tests(program) is None

    return check


def entry_problems(entry: Entry, *, with_tests: bool = True) -> list[str]:
    """Why an entry fails verification (empty when it passes or has nothing to check).

    The stated answer must appear in the solution, as a whole word or number; ``tests`` must pass when run
    (contained, `run_tests`) after the problem and its solution. ``with_tests=False`` leaves the tests
    unrun: they are code from the source's author.
    """
    if entry.tests is not None and with_tests:
        failure = run_tests(code_program(entry.problem, entry.solution, entry.tests, tested_name=None))
        if failure is not None:
            return [f"its tests fail: {failure}"]
    if entry.answer is None:
        return []
    answer = normalize_answer(entry.answer)
    solution = normalize_answer(entry.solution.replace(",", ""))
    pattern = r"(?<![\w.-])" + re.escape(answer.replace(",", "")) + r"(?![\w]|\.\d)"  # "4" is not in "-4"
    if not re.search(pattern, solution):
        return [f"answer {entry.answer!r} does not appear in the solution"]
    return []
