"""The graft template: a library entry written as a solved example, then the query continuing it.

The token sequence of every route is built here, from pieces that are tokenized separately:

    graft     restore(prefix state)      + suffix tokens
    text-rag  preamble + entry tokens    + suffix tokens   (the same ids as graft, prefilled)
    plain     preamble tokens            + suffix tokens   (the same template without the entry)

Because graft and text RAG are the same token ids fed in the same chunks, their logits are equal bit
for bit; the boundary never depends on how a tokenizer would merge across it.

Two answer formats, stored in the library:

- ``answer``: the entry shows its answer line first; the query ends in ``Answer:`` and decoding stops at
  the newline. For short answers (numbers, names).
- ``solution``: the entry shows its solution verbatim (indentation and blank lines kept) on the lines
  after ``Solution:`` and closes with `END_OF_SOLUTION`; the query ends in ``Solution:`` exactly where
  the entry's solution starts (the model writes the newline and the first line's indentation as the
  entry's tokens do), decoding stops at the marker, and the text is everything after that first newline.
  For code and derivations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ._exceptions import ConfigError

__all__ = [
    "END_OF_SOLUTION",
    "FORMATS",
    "TEMPLATE_VERSION",
    "AnswerFormat",
    "Entry",
    "auto_format",
    "default_stop",
    "render_entry",
    "render_preamble",
    "render_query",
    "template_id",
]

#: Bumped whenever the rendered text changes: it is part of the state fingerprint (see `template_id`).
TEMPLATE_VERSION = "solved-v2"

AnswerFormat = Literal["answer", "solution"]
FORMATS: tuple[AnswerFormat, ...] = ("answer", "solution")

#: Closes a solution in the ``solution`` format, on its own line; decoding stops before it.
END_OF_SOLUTION = "[end of solution]"

_PREAMBLE = "Solved problems with verified answers.\n\n"


@dataclass(frozen=True)
class Entry:
    """One library entry: a verified solved problem."""

    id: str
    problem: str
    solution: str
    answer: str | None = None
    tags: tuple[str, ...] = ()
    tests: str | None = None
    """Python that must run cleanly after ``problem + solution`` (asserts); checked at build."""

    def to_json(self) -> dict[str, object]:
        """The entry as a source-format JSON object."""
        out: dict[str, object] = {"id": self.id, "problem": self.problem, "solution": self.solution}
        if self.answer is not None:
            out["answer"] = self.answer
        if self.tags:
            out["tags"] = list(self.tags)
        if self.tests is not None:
            out["tests"] = self.tests
        return out


def auto_format(entries: Sequence[Entry]) -> AnswerFormat:
    """``answer`` when every entry has an answer, else ``solution`` (``build --format auto``)."""
    return "answer" if all(e.answer is not None for e in entries) else "solution"


def template_id(fmt: AnswerFormat = "answer") -> str:
    """The template's name in the state fingerprint (the ``answer`` format keeps the historical name)."""
    _check_format(fmt)
    return TEMPLATE_VERSION if fmt == "answer" else f"{TEMPLATE_VERSION}+{fmt}"


def default_stop(fmt: AnswerFormat = "answer") -> tuple[str, ...]:
    """Where decoding stops unless told otherwise: the newline for an answer, the end marker for a solution."""
    _check_format(fmt)
    return ("\n",) if fmt == "answer" else (f"\n{END_OF_SOLUTION}",)


def render_preamble() -> str:
    """Text that starts every prompt, with or without an entry."""
    return _PREAMBLE


def render_entry(entry: Entry, fmt: AnswerFormat = "answer") -> str:
    """The entry as a solved example. The graft prefix is ``preamble + entry``.

    ``answer``: the answer line comes *before* the solution, so a query ending in ``Answer:`` copies the
    verified answer in a few tokens instead of re-deriving the solution (measured on Gemma 3 270M:
    15/15 example problems answered this way, against 1/15 with no entry).
    ``solution``: the solution verbatim, then `END_OF_SOLUTION` on its own line.
    """
    _check_format(fmt)
    if fmt == "solution":
        return f"Problem: {entry.problem.strip()}\nSolution:\n{entry.solution.rstrip()}\n{END_OF_SOLUTION}\n\n"
    answer = f"Answer: {entry.answer.strip()}\n" if entry.answer is not None else ""
    return f"Problem: {entry.problem.strip()}\n{answer}Solution: {entry.solution.strip()}\n\n"


def render_query(
    question: str,
    *,
    system: str | None = None,
    history: Sequence[tuple[str, str]] = (),
    same_as: Entry | None = None,
    fmt: AnswerFormat = "answer",
) -> str:
    """The query suffix: the model continues after ``Answer:`` (the answer ends at the newline), or in the
    ``solution`` format after ``Solution:``, where the entry's own solution starts.

    A chat's ``system`` text and earlier ``(question, answer)`` turns go into the suffix, after the
    entry, so that the grafted prefix stays exactly the entry. Routing only sees ``question``.

    ``same_as``: the entry the router matched. Its problem is restated after the question, so that a
    reworded question is answered by copying the verified answer. Measured on Gemma 3 270M, 114 reworded
    example questions with their entry as text RAG: 87/114 correct without it, 111/114 with it (and
    "This is the same problem" alone: 69/114; the entry's problem alone, dropping the question: 108/114).
    """
    _check_format(fmt)
    head = f"{system.strip()}\n\n" if system and system.strip() else ""
    restated = f"This is the problem solved above: {same_as.problem.strip()}\n" if same_as is not None else ""
    if fmt == "solution":
        turns = "".join(f"Problem: {q.strip()}\nSolution:\n{a.rstrip()}\n{END_OF_SOLUTION}\n\n" for q, a in history)
        return f"{head}{turns}Problem: {question.strip()}\n{restated}Solution:"
    turns = "".join(f"Problem: {q.strip()}\nAnswer: {a.strip()}\n\n" for q, a in history)
    return f"{head}{turns}Problem: {question.strip()}\n{restated}Answer:"


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"answer format must be one of {', '.join(FORMATS)}; got {fmt!r}")
