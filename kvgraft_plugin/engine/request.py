"""One request on its way through the engine: its checked settings (`Request`), the route chosen for it
(`Plan`), and the `GraftResult` made from both."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.core.exceptions import ConfigError, QueryError
from kvgraft_plugin.core.sampling import SAMPLING_FIELDS, SamplingParams
from kvgraft_plugin.core.statefile import SavedState
from kvgraft_plugin.engine.decode import DecodeStats, Transcript
from kvgraft_plugin.engine.result import ROUTES, GraftResult
from kvgraft_plugin.library.library import EntryRecord, visible
from kvgraft_plugin.routing.router import GuardVerdict

__all__ = ["ROUTING_SETTINGS", "Plan", "Request", "check_question", "request_config"]

#: Settings a request may override (``stream(routing=...)``): they change the route, never the KV bytes.
ROUTING_SETTINGS = frozenset(
    {
        "threshold",
        "margin",
        "neighbors",
        "guards",
        "match_check",
        "fallback",
        "judge_model",
        "judge_threshold",
        "judge_mode",
        "profile",
        "related",
    }
)


@dataclass(frozen=True)
class Request:
    """A request's settings, each checked (`GraftEngine.stream` documents them)."""

    question: str
    mode: str
    entry_id: str | None
    system: str | None
    history: tuple[tuple[str, str], ...]
    max_tokens: int
    stop: tuple[str, ...]
    sampling: SamplingParams
    decode: str
    related_stop: tuple[str, ...] = ()
    """The stop strings when the question is put as a related problem: ``stop`` if the caller set it, else the
    template's for a related query (a solution's end, not an answer's)."""
    cue: str | None = None
    """``"same"`` or ``"related"``: how a forced route puts the question after its entry (``None``: as routed)."""

    @classmethod
    def make(
        cls,
        question: Any,
        config: EngineConfig,
        *,
        mode: str,
        entry_id: str | None,
        max_tokens: int | None,
        stop: Sequence[str] | None,
        system: str | None,
        history: Sequence[tuple[str, str]],
        decode: str | None,
        sampling: SamplingParams | None,
        sampling_fields: Mapping[str, Any],
        template_stop: Callable[..., tuple[str, ...]],
        cue: str | None = None,
    ) -> Request:
        """Check the settings of one `stream` call (`ConfigError`, `QueryError`) and fill in the config's
        defaults. Without ``stop``: none when a grammar ends the answer, else the config's, else
        ``template_stop(question)`` (``template_stop(question, related=True)`` for a related question)."""
        if mode not in ("auto", *ROUTES):
            raise ConfigError(f"mode must be one of auto, {', '.join(ROUTES)}; got {mode!r}")
        if cue not in (None, "same", "related") or (cue is not None and mode in ("auto", "plain")):
            raise ConfigError(f"cue is 'same' or 'related', with mode graft or text-rag; got {cue!r} with {mode!r}")
        if mode == "related":
            mode, cue = "graft", "related"
        check_question(question)
        budget = max_tokens if max_tokens is not None else config.max_tokens
        if budget < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {budget}")
        unknown = set(sampling_fields) - SAMPLING_FIELDS
        if unknown:
            raise ConfigError(f"unknown keyword arguments: {sorted(unknown)}")
        params = (sampling or config.sampling).replace(**sampling_fields)
        related_stop: Sequence[str] | None = stop
        if stop is None:
            if config.stop is not None:
                stop = related_stop = config.stop
            elif params.grammar is not None:
                stop = related_stop = ()
            else:
                stop, related_stop = template_stop(question), template_stop(question, related=True)
        decode = decode or config.decode
        if decode not in ("auto", "step", "lookup"):
            raise ConfigError(f"decode must be 'auto', 'step' or 'lookup', got {decode!r}")
        stops, related_stops = tuple(s for s in stop if s), tuple(s for s in related_stop or () if s)
        return cls(question, mode, entry_id, system, tuple(history), budget, stops, params, decode, related_stops, cue)


def request_config(config: EngineConfig, routing: Mapping[str, Any] | None) -> EngineConfig:
    """``config`` with one request's `ROUTING_SETTINGS` overrides."""
    if not routing:
        return config
    unknown = set(routing) - ROUTING_SETTINGS
    if unknown:
        raise ConfigError(f"not a per-request routing setting: {sorted(unknown)} (allowed: {sorted(ROUTING_SETTINGS)})")
    judge = routing.get("judge_model")
    if judge not in (None, "off", config.judge_model):
        # each judge is a model in memory: a request picks the engine's or none, never opens another
        raise ConfigError(f"a request's judge_model is 'off' or the engine's ({config.judge_model!r}), got {judge!r}")
    threshold = routing.get("judge_threshold")
    if isinstance(threshold, float) and math.isinf(threshold):
        raise ConfigError(f"a request's judge_threshold must be finite, got {threshold!r}")
    return config.with_settings(**routing)


def check_question(question: Any) -> None:
    """Refuse a query that is not a non-empty, visible, valid Unicode string (`QueryError`)."""
    if not isinstance(question, str):
        raise QueryError(f"the query must be a string, got {type(question).__name__}")
    if not visible(question):
        raise QueryError("the query is empty")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise QueryError("the query is not valid UTF-8") from exc


@dataclass
class Plan:
    """The route chosen for a request and the tokens it prefills."""

    route: str
    tokens: list[int]
    """Tokens to prefill from an empty cache (text-rag / plain) or after the restore (graft)."""
    n_suffix: int
    """How many of ``tokens`` are the query suffix (prefilled as their own chunks)."""
    record: EntryRecord | None = None
    state: SavedState | None = None
    score: float | None = None
    reason: str | None = None
    trail: tuple[GuardVerdict, ...] = ()
    """What the router's guards said (empty when the router was not asked)."""
    max_tokens: int | None = None
    """The decode budget when it had to shrink to fit the entry; ``None``: as requested."""
    notes: list[str] = field(default_factory=list)
    cue: str | None = None
    """``"same"`` (the entry's problem asked again) or ``"related"`` (a new problem after it); ``None``: plain."""

    def result(
        self, out: Transcript, stats: DecodeStats, decoder: str, start: float, phases: Mapping[str, float]
    ) -> GraftResult:
        """The request's result: this plan, decoded into ``out`` by ``decoder``, timed from ``start``."""
        record = self.record if self.route != "plain" else None
        ended = out.ended
        return GraftResult(
            text=out.text,
            route=self.route,
            entry_id=record.id if record else None,
            score=round(self.score, 6) if record and self.score is not None else None,
            fallback_reason=self.reason,
            prefill_tokens=len(self.tokens),
            restored_tokens=len(self.state.tokens) if self.state is not None else 0,
            decode_tokens=out.n_decoded,
            ttft_ms=_ms(start, out.first_token or ended),
            total_ms=_ms(start, ended),
            decode=decoder,
            decode_ms=round(phases["decode"], 3),
            drafted_tokens=stats.drafted,
            accepted_tokens=stats.accepted,
            finish_reason=out.finish,
            phases_ms={k: round(v, 3) for k, v in phases.items()},
            match=[v.to_json() for v in self.trail],
            notes=list(self.notes),
            cue=self.cue if record else None,
        )


def _ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000.0
