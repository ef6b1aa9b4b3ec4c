"""A request's start, serial or batched: route it, restore or prefill it into the current sequence, and say
how to decode it (`Started`).

    start(request) -> Planner.plan -> restore the entry's state, or clear -> prefill -> sampler, budget, stops

A state llama.cpp refuses is forgotten and its entry served by text RAG instead, with the reason in the
result. Runs on the engine's worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvgraft_plugin.core.backend import Backend
from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.core.exceptions import BackendError, RequestCancelledError
from kvgraft_plugin.core.models import check_unchanged, file_identity
from kvgraft_plugin.engine.batch_invariance import LookupBatch
from kvgraft_plugin.engine.decode import DecodeStats, Transcript
from kvgraft_plugin.engine.planner import Planner
from kvgraft_plugin.engine.request import Plan, Request
from kvgraft_plugin.engine.result import GraftResult
from kvgraft_plugin.engine.state_loader import StateLoader

__all__ = ["Started", "Starter"]

logger = logging.getLogger(__name__)


@dataclass
class Started:
    """A request routed and prefilled into the current sequence, ready to decode (`Starter.start`)."""

    sampler: Any
    """The request's `TokenSampler`."""
    limit: int
    """Tokens it may decode."""
    finish: Callable[[Transcript, DecodeStats, str], GraftResult]
    """Its result, from the transcript, the decoder's stats and the decoder's name."""
    context: list[int] = field(default_factory=list)
    """Every token in its sequence: restored, then prefilled."""
    n_entry: int = 0
    """How many of the first are the entry's (lookup drafts come from there first)."""
    lookup: int = 1
    """The batch lookup decoding may verify (1: step decoding)."""
    stop: tuple[str, ...] = ()
    """Its stop strings (the request's, for the route its plan took)."""


class Starter:
    """Starts requests on one backend: its planner, its saved states and its lookup measurement."""

    def __init__(self, backend: Backend, planner: Planner, states: StateLoader | None, lookup: LookupBatch) -> None:
        self.backend, self.planner, self.states, self.lookup = backend, planner, states, lookup
        self._model_identity = file_identity(backend.model_path)

    def start(
        self, request: Request, config: EngineConfig, *, lookup: bool, cancel: threading.Event | None = None
    ) -> Started:
        """Route ``request`` and restore or prefill it into the backend's current sequence: how to decode it
        (with ``lookup``, the batch lookup decoding may verify; without, step decoding). A ``cancel`` already
        set (the client left while the request waited) raises `RequestCancelledError` before any of that work."""
        if cancel is not None and cancel.is_set():
            raise RequestCancelledError("the request was cancelled before it started")
        start = time.perf_counter()
        check_unchanged(self.backend.model_path, self._model_identity, "the served model's")
        phases: dict[str, float] = {}
        plan = self.planner.plan(request, config, phases)
        if lookup:
            batch = self.lookup.for_request(
                request.decode, self.backend, plan.notes
            )  # before the prefill: it may measure
        else:
            batch = 1
            if request.decode == "lookup":
                plan.notes.append("lookup decoding not used: the request was decoded in a batch with others")
        try:
            self._prefill(plan, phases)
        except BackendError as exc:
            if plan.state is None or plan.record is None:
                raise
            # llama.cpp refused the bytes: forget them, and serve the entry by text RAG
            if self.states is not None:
                self.states.forget(plan.record)
            logger.warning("restore of %s refused by llama.cpp: %s", plan.record.id, exc)
            plan = self.planner.as_text_rag(plan, f"integrity: llama.cpp refused the state of {plan.record.id} ({exc})")
            self._prefill(plan, phases)

        # the sampler's history is the whole context, restored or prefilled: the same ids on every route
        context = list(plan.state.tokens) + plan.tokens if plan.state is not None else plan.tokens
        n_entry = len(context) - plan.n_suffix if plan.route != "plain" else 0  # drafts come from the entry first
        budget = plan.max_tokens if plan.max_tokens is not None else request.max_tokens
        limit = min(budget, self.backend.n_ctx - self.backend.n_past)
        sampler = self.backend.sampler(request.sampling, context)

        def finish(out: Transcript, stats: DecodeStats, decoder: str) -> GraftResult:
            if out.first_token is not None:
                phases["first_token"] = (out.first_token - out.started) * 1000.0
            phases["decode"] = (out.ended - out.started) * 1000.0
            return plan.result(out, stats, decoder, start, phases)

        stop = request.related_stop if plan.cue == "related" else request.stop
        return Started(sampler, limit, finish, context, n_entry, batch, stop)

    def start_batched(self, request: Request, config: EngineConfig, cancel: threading.Event) -> Started:
        """`start` for the scheduler: step decoding, since the batch's other sequences decode beside it."""
        return self.start(request, config, lookup=False, cancel=cancel)

    def _prefill(self, plan: Plan, phases: dict[str, float]) -> None:
        """Restore the state (graft) or clear the cache, then prefill.

        Text RAG and plain prefill the prefix, then the suffix: the same ids in the same
        ``n_batch`` chunks as graft's restore + suffix, which is what makes their logits equal.
        """
        backend = self.backend
        t0 = time.perf_counter()
        if plan.state is not None:
            backend.restore_state(plan.state.payload, len(plan.state.tokens))
        else:
            backend.reset()
        t1 = time.perf_counter()
        n_prefix = len(plan.tokens) - plan.n_suffix
        if n_prefix:
            backend.prefill(plan.tokens[:n_prefix])
        backend.prefill(plan.tokens[n_prefix:])
        phases["restore"] = (t1 - t0) * 1000.0
        phases["prefill"] = (time.perf_counter() - t1) * 1000.0
