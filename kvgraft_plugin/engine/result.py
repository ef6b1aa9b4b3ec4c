"""What a request returns: the streamed `GraftChunk`s and the final `GraftResult`; a tool's `Capture`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ROUTES", "Capture", "GraftChunk", "GraftResult"]

#: ``related`` restores a related entry's state as ``graft`` restores the same problem's, and asks the question as
#: a new problem after it (`kvgraft_plugin.library.template.RELATED`).
ROUTES = ("graft", "related", "text-rag", "plain")


@dataclass
class GraftResult:
    """The answer and how it was produced. `to_json` gives the CLI's ``--json`` object."""

    text: str
    route: str
    """``"graft"``, ``"related"``, ``"text-rag"`` or ``"plain"``: the route actually taken."""
    entry_id: str | None
    score: float | None
    """Cosine similarity of the routed entry; ``None`` when forced with ``entry_id`` or not routed."""
    fallback_reason: str | None
    """``None`` when the requested route was taken, else ``code`` or ``"code: message"``."""
    prefill_tokens: int
    """Tokens run through the model before the first decode."""
    restored_tokens: int
    """Tokens whose KV came from a saved state."""
    decode_tokens: int
    """Tokens generated (an end-of-generation token included)."""
    ttft_ms: float
    total_ms: float
    decode: str = "step"
    """The decoder used: ``"step"`` or ``"lookup"``."""
    decode_ms: float = 0.0
    """From the first token to the last."""
    drafted_tokens: int = 0
    """Lookup decoding: draft tokens verified."""
    accepted_tokens: int = 0
    """Lookup decoding: draft tokens the sampler chose too."""
    finish_reason: str = "stop"
    """``"stop"`` (stop string), ``"eog"`` (end-of-generation token), ``"length"`` or ``"cancelled"``."""
    phases_ms: dict[str, float] = field(default_factory=dict)
    """embed, search, read, check, restore, prefill, first_token, decode."""
    match: list[dict[str, Any]] = field(default_factory=list)
    """The router's guard trail: every guard that ran, on which entry, and what it said."""
    notes: list[str] = field(default_factory=list)
    """What the engine changed in the request and why (a decode budget capped to fit the entry)."""
    cue: str | None = None
    """How the question was put after the entry: ``"same"`` (the same problem asked again), ``"related"``
    (a new problem after a related worked example), ``None`` on the plain route."""

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object."""
        return asdict(self)


@dataclass
class GraftChunk:
    """A piece of streamed text. The last chunk carries the final `GraftResult`."""

    text: str
    result: GraftResult | None = None


@dataclass(frozen=True)
class Capture:
    """A saved sequence state and, when a probe was given, how exactly it restores."""

    payload: bytearray
    max_diff: float | None
    """Max |logit diff| of the probe after a restore vs after a fresh prefill: 0.0 is bitwise equal;
    ``None`` without a probe; NaN when they differ without a finite gap."""
