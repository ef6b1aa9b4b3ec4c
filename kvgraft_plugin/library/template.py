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

Two templates, stored in the library:

- ``text`` (`TextTemplate`): the layout above, one plain string per piece. For base models.
- ``chat`` (`ChatTemplate`): the model's own chat template lays the same pieces out as turns. The entry
  is a user turn (its problem) and an assistant turn (its answer or solution); the query, with a
  request's system text and earlier turns, follows as the next user turn and the generation prompt. The
  prefix ends at the assistant turn's end, a turn boundary. Special tokens come only from the template's
  markup: every message's text is tokenized as plain text, so ``<|im_end|>`` typed in a question is
  not an end of turn. For instruct models.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kvgraft_plugin.core.exceptions import ConfigError
from kvgraft_plugin.library.python_prompt import python_prompt, renamed_like

__all__ = [
    "CODE_FENCE",
    "END_OF_SOLUTION",
    "FORMATS",
    "RELATED",
    "SAME_TASK",
    "TEMPLATES",
    "TEMPLATE_VERSION",
    "AnswerFormat",
    "ChatTemplate",
    "Entry",
    "Prompt",
    "Segment",
    "Template",
    "TemplateKind",
    "TextTemplate",
    "auto_format",
    "default_stop",
    "is_code_prompt",
    "render_entry",
    "render_preamble",
    "render_query",
    "template_id",
]

#: Bumped whenever the rendered text changes: it is part of the state fingerprint (see `template_id`). This is
#: the default rendering's (the ``text`` template, ``answer`` format), at v3 since it repeats the answer line
#: after the solution; every other rendering is unchanged since `_V2`, and keeps that name.
TEMPLATE_VERSION = "solved-v3"
_V2 = "solved-v2"
#: The chat template's ``solution`` format since a function prompt's entry is answered as a fenced block.
_CHAT_SOLUTION = "solved-v4"

AnswerFormat = Literal["answer", "solution"]
FORMATS: tuple[AnswerFormat, ...] = ("answer", "solution")
TemplateKind = Literal["text", "chat"]
TEMPLATES: tuple[TemplateKind, ...] = ("text", "chat")

#: Closes a solution in the ``solution`` format, on its own line; decoding stops before it.
END_OF_SOLUTION = "[end of solution]"
#: Opens and closes a code block in the chat template's ``solution`` format (Markdown, as instruct models write).
CODE_FENCE = "```"
CODE_OPENER = f"{CODE_FENCE}python\n"

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


def template_id(fmt: AnswerFormat = "answer", kind: TemplateKind = "text", chat_name: str | None = None) -> str:
    """The template's name in the state fingerprint: `TEMPLATE_VERSION` for the ``text`` template's ``answer``
    format, else ``solved-v2`` with the format and the chat template's name (those renderings are unchanged,
    so their libraries stay valid)."""
    _check_format(fmt)
    if fmt == "answer" and kind == "text":
        return TEMPLATE_VERSION
    name = _V2 if fmt == "answer" else f"{_CHAT_SOLUTION if kind == 'chat' else _V2}+{fmt}"
    if kind == "chat":
        name += f"+chat:{chat_name or 'gguf'}"
    return name


def default_stop(
    fmt: AnswerFormat = "answer", kind: TemplateKind = "text", *, fenced: bool = False, related: bool = False
) -> tuple[str, ...]:
    """Where decoding stops unless told otherwise: the newline for an answer; the end marker for a solution
    in the text template; in the chat template the model's end-of-turn token (an end of generation), and
    for a function prompt (``fenced``) the code block's closing fence. A ``related`` query is answered by a
    solution in either format: in the text template's ``answer`` format it ends where the entry's does, at
    its blank line (or a next ``Problem:``)."""
    _check_format(fmt)
    if related and fmt == "answer":
        return ("\n\n", "\nProblem:") if kind == "text" else default_stop("solution", kind, fenced=fenced)
    if fmt == "answer":
        return ("\n",)
    if kind == "text":
        return (f"\n{END_OF_SOLUTION}",)
    return (f"\n{CODE_FENCE}",) if fenced else ()


def is_code_prompt(text: str) -> bool:
    """A Python function prompt (a ``def`` with a docstring, imports allowed before it): the chat template
    answers it as a fenced code block."""
    return python_prompt(text) is not None


def render_preamble() -> str:
    """Text that starts every prompt, with or without an entry."""
    return _PREAMBLE


def render_entry(entry: Entry, fmt: AnswerFormat = "answer") -> str:
    """The entry as a solved example. The graft prefix is ``preamble + entry``.

    ``answer``: the answer line comes *before* the solution, so a query ending in ``Answer:`` copies the
    verified answer in a few tokens instead of re-deriving the solution (measured on Gemma 3 270M:
    15/15 example problems answered this way, against 1/15 with no entry), and again after it, so that a long
    solution does not stand between the answer and the query (the 249 covered queries of
    `examples/routing/` with their entry as text RAG: 240 right with the answer first only, 247 with it
    repeated, 156 with it last only; the tuning part alone: 138, 141 and 98 of 143).
    ``solution``: the solution verbatim, then `END_OF_SOLUTION` on its own line.
    """
    _check_format(fmt)
    if fmt == "solution":
        return f"Problem: {entry.problem.strip()}\nSolution:\n{entry.solution.rstrip()}\n{END_OF_SOLUTION}\n\n"
    answer = f"Answer: {entry.answer.strip()}\n" if entry.answer is not None else ""
    return f"Problem: {entry.problem.strip()}\n{answer}Solution: {entry.solution.strip()}\n{answer}\n"


def render_query(
    question: str,
    *,
    system: str | None = None,
    history: Sequence[tuple[str, str]] = (),
    same_as: Entry | None = None,
    related: bool = False,
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

    ``related``: the entry above is a related worked example, not this problem: the question is followed by
    `RELATED`, and the model continues after ``Solution:`` in either format (it writes its own solution
    before any answer, so it does not copy the entry's).
    """
    _check_format(fmt)
    head = f"{system.strip()}\n\n" if system and system.strip() else ""
    restated = _restated(same_as, question)
    if related:
        return f"{head}{_history(history, fmt)}Problem: {question.strip()}\n{RELATED}\nSolution:"
    turns = _history(history, fmt)
    opener = "Solution:" if fmt == "solution" else "Answer:"
    return f"{head}{turns}Problem: {question.strip()}\n{restated}{opener}"


def _history(history: Sequence[tuple[str, str]], fmt: AnswerFormat) -> str:
    """Earlier ``(question, answer)`` turns in the text template."""
    if fmt == "solution":
        return "".join(f"Problem: {q.strip()}\nSolution:\n{a.rstrip()}\n{END_OF_SOLUTION}\n\n" for q, a in history)
    return "".join(f"Problem: {q.strip()}\nAnswer: {a.strip()}\n\n" for q, a in history)


def _restated(same_as: Entry | None, question: str) -> str:
    """The matched entry's problem, in the question's names when both are function prompts: measured on Gemma
    3 270M, the code library's 26 renamed and 12 reworded tasks forced onto their entry pass their tests
    23/26 and 7/12 restated in the question's names, 9/26 and 6/12 in the entry's own (the copied body kept
    the entry's parameter names), 5/26 and 6/12 with a "Names: old -> new" line added instead."""
    if same_as is None:
        return ""
    return f"This is the problem solved above: {renamed_like(same_as.problem, question).strip()}\n"


# -- templates: the pieces of every route as tokenizable segments ------------------------------------


@dataclass(frozen=True)
class Segment:
    """A piece of a prompt, tokenized on its own."""

    text: str
    special: bool = False
    """True for a chat template's markup: special-token syntax in it becomes special tokens."""


Prompt = tuple[Segment, ...]


class Template(Protocol):
    """How one answer format is laid out as segments: ``preamble`` starts every prompt, ``prefix(entry)``
    is what a graft restores (it starts with the preamble), ``query`` is the suffix fed after either."""

    @property
    def fmt(self) -> AnswerFormat:
        """The answer format."""

    @property
    def kind(self) -> TemplateKind:
        """``text`` or ``chat``."""

    @property
    def name(self) -> str:
        """The template's id in the state fingerprint."""

    def preamble(self) -> Prompt:
        """The start of every prompt; plain decoding is ``preamble + query``."""

    def prefix(self, entry: Entry) -> Prompt:
        """``preamble`` and the entry: the graft prefix."""

    def query(
        self,
        question: str,
        *,
        system: str | None = None,
        history: Sequence[tuple[str, str]] = (),
        same_as: Entry | None = None,
        related: bool = False,
    ) -> Prompt:
        """The suffix after the preamble or the prefix; the model continues it. ``same_as``: the entry it asks
        again; ``related``: the entry before it is a related worked example (`RELATED`)."""

    def stop(self, question: str | None = None, *, related: bool = False) -> tuple[str, ...]:
        """Default stop strings (for ``question``, when they depend on it; ``related``: for a related query)."""

    def trim(self, text: str) -> str:
        """The answer text from the decoded text."""


@dataclass(frozen=True)
class TextTemplate:
    """``Problem: … Answer:`` in plain text (`render_entry`, `render_query`); for base models."""

    fmt: AnswerFormat = "answer"
    kind: TemplateKind = "text"

    def __post_init__(self) -> None:
        _check_format(self.fmt)

    @property
    def name(self) -> str:
        return template_id(self.fmt)

    def preamble(self) -> Prompt:
        return (Segment(render_preamble()),)

    def prefix(self, entry: Entry) -> Prompt:
        return (Segment(render_preamble() + render_entry(entry, self.fmt)),)

    def query(
        self,
        question: str,
        *,
        system: str | None = None,
        history: Sequence[tuple[str, str]] = (),
        same_as: Entry | None = None,
        related: bool = False,
    ) -> Prompt:
        rendered = render_query(
            question, system=system, history=history, same_as=same_as, related=related, fmt=self.fmt
        )
        return (Segment(rendered),)

    def stop(self, question: str | None = None, *, related: bool = False) -> tuple[str, ...]:
        return default_stop(self.fmt, related=related)

    def trim(self, text: str) -> str:
        """An answer drops its leading whitespace; a solution drops only the newline after ``Solution:`` and
        keeps its first line's indentation."""
        if self.fmt == "answer":
            return text.lstrip()
        return text[1:] if text.startswith("\n") else text


#: ``render(messages, add_generation_prompt) -> text``: the model's chat template (`Backend.render_chat`).
ChatRenderer = Callable[[Sequence[tuple[str, str]], bool], str]

#: After a matched query in the chat template, in place of the text template's restated problem. Measured
#: on the code library's 26 repeats, built with the chat template (`kvgraft bench --checker tests`): with
#: "Same task as above." alone Qwen2.5-Coder-1.5B's graft passed 25/26 (in `snake-to-camel` it wrote a
#: one-liner of its own), with this 26/26, and SmolLM2-135M's text RAG and graft 4/26 and 7/26. Earlier, on
#: SmolLM2: 9/26 with the short form, 0/26 with the problem restated, 7/26 with nothing.
SAME_TASK = "Same task as above. Reuse the solution above."
#: After a question whose nearest entry is a related problem, not the same (the ``related`` route): the entry
#: stays a worked example, and the model writes its own solution. Measured on Qwen2.5-Coder-1.5B-Instruct
#: (issue 50): 21 held-out near-misses, step by step, 9/21 right alone and 15/21 after their entry with a cue of
#: this sense; asked for the answer at once after the entry, it gave the entry's answer to 11/21.
RELATED = (
    "This problem may differ from the one solved above in its numbers or in what it asks: "
    "solve it step by step, then give the answer."
)

_SLOT = re.compile("\ue000(\\d+)\ue001")


@dataclass(frozen=True)
class ChatTemplate:
    """The model's chat template around the same pieces; for instruct models.

    Messages are rendered with placeholders, so the template contributes only markup (tokenized with
    special tokens) and every message's text is inserted verbatim (tokenized as plain text). The
    ``answer`` format shows ``Answer: … / Solution: …`` as the entry's assistant turn and opens the
    query's assistant turn with ``Answer:``; the ``solution`` format's assistant turn is the solution
    verbatim and the answer ends at the model's end of turn. A function prompt's solution is written as
    instruct models write code: the whole function in a ```` ```python ```` block (the entry's problem and its
    solution); a function prompt's query opens its assistant turn with that block's first line, and decoding
    stops at the closing fence, so a covered answer costs the code's tokens and not the prose an instruct
    model writes after it. A request's system text is put before its question in the user turn: templates
    differ on where (and whether) a system turn may follow others.
    """

    render: ChatRenderer
    fmt: AnswerFormat = "answer"
    chat_name: str | None = None
    """A llama.cpp built-in template's name, or ``None`` for the model's own (GGUF ``tokenizer.chat_template``)."""
    kind: TemplateKind = "chat"

    def __post_init__(self) -> None:
        _check_format(self.fmt)

    @property
    def name(self) -> str:
        return template_id(self.fmt, "chat", self.chat_name)

    def preamble(self) -> Prompt:
        return self._split("q", (), None)[0]

    def prefix(self, entry: Entry) -> Prompt:
        preamble, entry_turns, _ = self._split("q", (), entry)
        return preamble + entry_turns

    def query(
        self,
        question: str,
        *,
        system: str | None = None,
        history: Sequence[tuple[str, str]] = (),
        same_as: Entry | None = None,
        related: bool = False,
    ) -> Prompt:
        head = f"{system.strip()}\n\n" if system and system.strip() else ""
        cue = f"\n{SAME_TASK}" if same_as is not None else f"\n{RELATED}" if related else ""
        fenced = self._fenced(question)
        return self._split(f"{head}{question.strip()}{cue}", history, same_as, fenced=fenced, related=related)[2]

    def stop(self, question: str | None = None, *, related: bool = False) -> tuple[str, ...]:
        """`default_stop`, and the end-of-turn marker written out as text (``<|im_end|>``): a model that
        spells it in plain tokens (echoing a question that holds it) ends its turn there too."""
        marker = self._end_of_turn
        stop = default_stop(self.fmt, "chat", fenced=self._fenced(question), related=related)
        return stop + ((marker,) if marker else ())

    @functools.cached_property
    def _end_of_turn(self) -> str:
        """The markup the template writes right after an assistant turn's text, up to its first space or
        newline (``<|im_end|>``, ``<end_of_turn>``), or ``""`` when it writes none."""
        rendered = self.render([("user", "\ue0000\ue001"), ("assistant", "\ue0001\ue001")], False)
        after = rendered.partition("\ue0001\ue001")[2].strip()
        return after.split()[0] if after else ""

    def _fenced(self, problem: str | None) -> bool:
        """A function prompt in the ``solution`` format: its answer is a ``python`` code block."""
        return self.fmt == "solution" and problem is not None and is_code_prompt(problem)

    def trim(self, text: str) -> str:
        return text.lstrip() if self.fmt == "answer" else text

    def _assistant(self, text: str, answer: str | None = None, *, shown: bool = True) -> str:
        """An assistant turn: an entry's (``shown``: answer and solution) or an earlier reply's."""
        if self.fmt == "solution":
            return text.rstrip()
        if not shown:
            return f"Answer: {text.strip()}"
        return (f"Answer: {answer.strip()}\n" if answer is not None else "") + f"Solution: {text.strip()}"

    def _split(
        self,
        question: str,
        history: Sequence[tuple[str, str]],
        entry: Entry | None,
        *,
        fenced: bool = False,
        related: bool = False,
    ) -> tuple[Prompt, Prompt, Prompt]:
        """(preamble, entry turns, query suffix), checked to concatenate to the template's own rendering;
        ``fenced``: the suffix opens the answer's code block; ``related``: the ``answer`` format's suffix opens
        a solution, not an answer."""
        turns: list[tuple[str, str]] = []
        for q, a in history:
            turns += [("user", q.strip()), ("assistant", self._assistant(a, shown=False))]
        turns.append(("user", question.rstrip()))
        shown = entry or Entry("-", "problem", "solution", "answer")
        solved = self._assistant(shown.solution, shown.answer)
        if self._fenced(shown.problem):
            solved = f"{CODE_OPENER}{shown.problem.strip()}\n{shown.solution.rstrip()}\n{CODE_FENCE}"
        entry_turns = [("user", shown.problem.strip()), ("assistant", solved)]
        contents = [c for _, c in entry_turns + turns]
        slots = [(role, f"\ue000{i}\ue001") for i, (role, _) in enumerate(entry_turns + turns)]
        with_entry = self.render(slots, True)
        entry_only = self.render(slots[:2], False)
        plain = self.render(slots[2:], True)
        suffix = with_entry[len(entry_only) :]
        if not with_entry.startswith(entry_only) or not plain.endswith(suffix):
            raise ConfigError(
                f"the chat template {self.chat_name or '(the model’s own)'} does not end a turn where the next "
                "begins, so a graft prefix cannot be cut from it; use --template text"
            )
        preamble = plain[: len(plain) - len(suffix)]
        if not entry_only.startswith(preamble):
            raise ConfigError(
                f"the chat template {self.chat_name or '(the model’s own)'} starts a conversation differently "
                "with and without the entry, so a graft prefix cannot be cut from it; use --template text"
            )
        if self.fmt == "answer":
            opener: Prompt = (Segment("Solution:" if related else "Answer:"),)
        else:
            opener = (Segment(CODE_OPENER),) if fenced else ()
        return (
            _segments(preamble, contents),
            _segments(entry_only[len(preamble) :], contents),
            _segments(suffix, contents) + opener,
        )


def _segments(rendered: str, contents: Sequence[str]) -> Prompt:
    """Markup between placeholders as special segments, each placeholder as its message's plain text."""
    out: list[Segment] = []
    pos = 0
    for m in _SLOT.finditer(rendered):
        if m.start() > pos:
            out.append(Segment(rendered[pos : m.start()], special=True))
        out.append(Segment(contents[int(m.group(1))]))
        pos = m.end()
    if pos < len(rendered) or not out:
        out.append(Segment(rendered[pos:], special=True))
    return tuple(out)


def make_template(
    kind: TemplateKind = "text",
    fmt: AnswerFormat = "answer",
    *,
    render: ChatRenderer | None = None,
    chat_name: str | None = None,
) -> Template:
    """The template of a library or engine; ``chat`` needs the model's renderer."""
    if kind == "text":
        return TextTemplate(fmt)
    if kind != "chat":
        raise ConfigError(f"template must be one of {', '.join(TEMPLATES)}; got {kind!r}")
    if render is None:
        raise ConfigError("the chat template needs the model's renderer")
    return ChatTemplate(render, fmt, chat_name)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"answer format must be one of {', '.join(FORMATS)}; got {fmt!r}")
