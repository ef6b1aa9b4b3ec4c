"""Aliases: questions a judge approved as an entry's problem, kept in the library's manifest.

An approved pair (`kvgraft_plugin.routing.deferred_judge`) becomes an `Alias` of the entry, stored in the
manifest (signed with it) with the judge's margin and model. The next time that question is asked it grafts
with no judgement, here and in every process that opens the library.

An alias is matched on the question's exact text (Unicode NFKC, runs of whitespace as one space): a reworded
question is a new pair for the judge, never an alias's neighbour. It holds only while its entry's text is the
text that was judged (``entry_sha256``); `kvgraft aliases` lists and revokes them.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Alias", "alias_key", "parse_aliases", "parse_revoked"]


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
    """`kvgraft_plugin.library.library.source_sha256` of the entry that was judged: a changed entry drops its
    aliases."""
    margin: float
    """The judge's Yes-minus-No margin for the pair."""
    threshold: float
    """The margin it needed."""
    judge: str
    """The judge model's name."""
    prompt: str
    """The judge prompt's name (`kvgraft_plugin.routing.judge.JUDGE_PROMPT`)."""
    score: float
    """The question's cosine similarity to the entry when it was judged (reported as a match's score)."""
    added: str
    """When it was approved (ISO 8601, UTC)."""
    rewording: float | None = None
    """The rewording check's score, for a small edit it read (`kvgraft_plugin.routing.rewording`)."""
    numerals: bool | None = None
    """Whether the numbers the question writes in words read as the entry's (`kvgraft_plugin.routing.numerals`), for a
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
