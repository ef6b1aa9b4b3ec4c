"""A template's prompts as token ids, the same on every route: markup tokenized with special tokens, text
without (`Segment.special`). Runs the backend's tokenizer, so it is called on the engine's worker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvgraft_plugin.library.template import Entry, Prompt, Template

__all__ = ["PromptTokens"]

Tokenize = Callable[..., list[int]]
"""``tokenize(text, add_bos=..., special=...)``: the backend's."""


class PromptTokens:
    """Token ids of ``template``'s preamble, graft prefixes and query suffixes."""

    def __init__(self, template: Template, tokenize: Tokenize) -> None:
        self.template = template
        self._tokenize = tokenize
        self._preamble: list[int] | None = None

    def tokens(self, prompt: Prompt, *, add_bos: bool = False) -> list[int]:
        """``prompt``'s segments tokenized one by one."""
        tokens: list[int] = []
        for i, segment in enumerate(prompt):
            tokens += self._tokenize(segment.text, add_bos=add_bos and i == 0, special=segment.special)
        return tokens

    def preamble(self) -> list[int]:
        """What every route starts with (plain decoding: all it has before the query)."""
        if self._preamble is None:
            self._preamble = self.tokens(self.template.preamble(), add_bos=True)
        return list(self._preamble)

    def prefix(self, record_or_entry: Any) -> list[int]:
        """The graft prefix of an entry (or its record): preamble + entry, what its saved state holds."""
        return self.tokens(self.template.prefix(getattr(record_or_entry, "entry", record_or_entry)), add_bos=True)

    def suffix(
        self,
        question: str,
        *,
        system: str | None = None,
        history: Sequence[tuple[str, str]] = (),
        same_as: Entry | None = None,
        related: bool = False,
    ) -> list[int]:
        """The query suffix; ``same_as``: the entry it is routed to (its problem is restated); ``related``: the
        entry before it is a related worked example."""
        prompt = self.template.query(question, system=system, history=history, same_as=same_as, related=related)
        return self.tokens(prompt)

    def probe(self, entry: Entry) -> list[int]:
        """The suffix that asks ``entry``'s own problem: the probe of every restore check."""
        return self.suffix(entry.problem, same_as=entry)
