"""The graft template: a library entry written as a solved example, then the query continuing it.

The token sequence of every route is built here, from pieces that are tokenized separately:

    graft     restore(prefix state)      + suffix tokens
    text-rag  preamble + entry tokens    + suffix tokens   (the same ids as graft, prefilled)
    plain     preamble tokens            + suffix tokens   (the same template without the entry)

Because graft and text RAG are the same token ids fed in the same chunks, their logits are equal bit
for bit; the boundary never depends on how a tokenizer would merge across it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["TEMPLATE_VERSION", "Entry", "render_entry", "render_preamble", "render_query"]

#: Bumped whenever the rendered text changes: it is part of the state fingerprint.
TEMPLATE_VERSION = "solved-v2"

_PREAMBLE = "Solved problems with verified answers.\n\n"


@dataclass(frozen=True)
class Entry:
    """One library entry: a verified solved problem."""

    id: str
    problem: str
    solution: str
    answer: str | None = None
    tags: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The entry as a source-format JSON object."""
        out: dict[str, object] = {"id": self.id, "problem": self.problem, "solution": self.solution}
        if self.answer is not None:
            out["answer"] = self.answer
        if self.tags:
            out["tags"] = list(self.tags)
        return out


def render_preamble() -> str:
    """Text that starts every prompt, with or without an entry."""
    return _PREAMBLE


def render_entry(entry: Entry) -> str:
    """The entry as a solved example. The graft prefix is ``preamble + entry``.

    The answer line comes *before* the solution: a query ending in ``Answer:`` then copies the
    verified answer in a few tokens instead of re-deriving the solution (measured on Gemma 3 270M:
    15/15 example problems answered this way, against 1/15 with no entry).
    """
    answer = f"Answer: {entry.answer.strip()}\n" if entry.answer is not None else ""
    return f"Problem: {entry.problem.strip()}\n{answer}Solution: {entry.solution.strip()}\n\n"


def render_query(
    question: str,
    *,
    system: str | None = None,
    history: Sequence[tuple[str, str]] = (),
    same_as: Entry | None = None,
) -> str:
    """The query suffix: the model continues after ``Answer:``; the answer ends at the newline.

    A chat's ``system`` text and earlier ``(question, answer)`` turns go into the suffix, after the
    entry, so that the grafted prefix stays exactly the entry. Routing only sees ``question``.

    ``same_as``: the entry the router matched. Its problem is restated after the question, so that a
    reworded question is answered by copying the verified answer. Measured on Gemma 3 270M, 114 reworded
    example questions with their entry as text RAG: 87/114 correct without it, 111/114 with it (and
    "This is the same problem" alone: 69/114; the entry's problem alone, dropping the question: 108/114).
    """
    head = f"{system.strip()}\n\n" if system and system.strip() else ""
    turns = "".join(f"Problem: {q.strip()}\nAnswer: {a.strip()}\n\n" for q, a in history)
    restated = f"This is the problem solved above: {same_as.problem.strip()}\n" if same_as is not None else ""
    return f"{head}{turns}Problem: {question.strip()}\n{restated}Answer:"
