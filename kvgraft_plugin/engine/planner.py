"""The route of one request: match an entry, check it fits and its state is usable, or fall back.

Every fallback says why (`Plan.reason`, a code then a message): ``no-match``, ``unsigned``,
``integrity``, ``too-long`` (to plain decoding), ``missing``, ``inexact``, ``incompatible`` and the other
`StateError` reasons (to text RAG with the same entry). A route that uses an entry for the same problem
restates the entry's problem in the query suffix (the same on graft and text RAG), which makes the model copy
the verified answer for a reworded question instead of re-deriving it. A question whose nearest entry is
close but not the same problem takes the ``related`` route where it is on (`LibraryRouting.related`): the
entry's state is restored as for a graft, and the suffix asks the question as a new problem after it.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.core.exceptions import ContextOverflowError, LibraryError, NoMatchError, StateError
from kvgraft_plugin.engine.prompt_tokens import PromptTokens
from kvgraft_plugin.engine.request import Plan, Request
from kvgraft_plugin.engine.state_loader import StateLoader
from kvgraft_plugin.library.aliases import alias_key
from kvgraft_plugin.library.library import Library, source_sha256
from kvgraft_plugin.routing.library_routing import LibraryRouting
from kvgraft_plugin.routing.router import NoMatch

__all__ = ["Planner"]

logger = logging.getLogger(__name__)


class Planner:
    """Plans requests over ``library`` (``None``: plain decoding only) in a context of ``n_ctx`` tokens."""

    def __init__(
        self,
        library: Library | None,
        routing: LibraryRouting,
        states: StateLoader | None,
        prompts: PromptTokens,
        n_ctx: int,
    ) -> None:
        self.library, self.routing, self.states, self.prompts, self.n_ctx = library, routing, states, prompts, n_ctx

    def plan(self, request: Request, config: EngineConfig, phases: dict[str, float]) -> Plan:
        """The route for ``request`` under ``config``'s routing settings; ``phases`` gets the router's and the
        state check's times."""
        plain_suffix = self.prompts.suffix(request.question, system=request.system, history=request.history)
        plain = Plan("plain", self.prompts.preamble() + plain_suffix, len(plain_suffix))
        if len(plain.tokens) >= self.n_ctx:
            raise ContextOverflowError(f"the query needs {len(plain.tokens)} tokens; n_ctx is {self.n_ctx}")
        if request.mode == "plain":
            return plain
        library = self.library
        if library is None:
            if request.mode != "auto" or request.entry_id is not None:
                raise LibraryError("no library is loaded")
            return _no_match(config, plain, "no library is loaded")
        if not library.trusted:
            plain.reason = f"unsigned: {library.untrusted_reason}"
            return plain

        # match: the same problem, else (where it is on) a related one
        score: float | None = None
        cue = request.cue or "same"
        if request.entry_id is not None:
            record = library.get(request.entry_id)
        else:
            router = self.routing.router(config)
            if router is None:
                return _no_match(config, plain, "the library has no entries or no index yet (rerun kvgraft build)")
            decision = router.route(request.question)
            phases.update(decision.phases_ms)
            plain.trail = decision.trail
            if isinstance(decision, NoMatch):
                if not self._related(request, config, decision, plain):
                    return _no_match(config, plain, decision.reason)
                cue = "related"
            record, score = library.get(decision.entry_id), decision.score  # type: ignore[arg-type]

        if source_sha256(record.entry) != record.source_sha256:
            # text that fails its check never reaches a prompt, on any route
            plain.reason = f"integrity: the text of entry {record.id!r} changed after it was built"
            return plain
        related = cue == "related"
        suffix = self.prompts.suffix(
            request.question, system=request.system, history=request.history,
            same_as=None if related else record.entry, related=related,
        )  # fmt: skip
        room = self.n_ctx - len(record.tokens) - len(suffix)
        if room < 1:
            plain.reason = f"too-long: entry {record.id} + query exceed n_ctx={self.n_ctx}"
            return plain
        budget, notes = request.max_tokens, []
        if budget > room:
            notes.append(f"max_tokens {budget} capped at {room}: what fits after entry {record.id} in n_ctx")
            budget = room
        route = "related" if related else "graft"
        graft = Plan(route, suffix, len(suffix), record, None, score, None, plain.trail, budget, notes, cue)
        if request.mode == "text-rag":
            return self.as_text_rag(graft)

        # the state: checked before its first use in this process, then cached
        t0 = time.perf_counter()
        try:
            graft.state = self.states.load(record)  # type: ignore[union-attr]
            return graft
        except FileNotFoundError:
            return self.as_text_rag(graft, f"missing: state file of {record.id} not found")
        except OSError as exc:
            return self.as_text_rag(graft, f"missing: state file of {record.id} cannot be read ({exc.strerror or exc})")
        except StateError as exc:
            logger.warning("entry %s falls back to text RAG: %s", record.id, exc)
            return self.as_text_rag(graft, f"{exc.reason}: {exc}")
        finally:
            phases["check"] = (time.perf_counter() - t0) * 1000.0

    def _related(self, request: Request, config: EngineConfig, decision: NoMatch, plain: Plan) -> bool:
        """Whether ``decision``'s nearest entry is a related problem to answer the question after: the route is
        on (or forced: ``mode="related"``), the entry is at or above the related threshold, and the user has
        not revoked it for the question. Why the route is off goes to ``plain``'s notes when it would apply."""
        forced = request.cue == "related"
        if decision.entry_id is None or decision.score is None or not (forced or request.mode == "auto"):
            return False
        on, threshold, why_off = self.routing.related(config)
        if decision.score < threshold or self.routing.revoked.get(alias_key(request.question)) == decision.entry_id:
            return False
        if not (on or forced):
            plain.notes.append(f"related route off for entry {decision.entry_id}: {why_off}")
        return on or forced

    def as_text_rag(self, plan: Plan, reason: str | None = None) -> Plan:
        """A graft ``plan``'s entry served by text RAG instead: its prefix rendered from the entry's text
        (checked by `plan`), so a damaged state cannot change the prompt, then the same suffix."""
        tokens = self.prompts.prefix(plan.record) + plan.tokens
        return dataclasses.replace(plan, route="text-rag", tokens=tokens, state=None, reason=reason)


def _no_match(config: EngineConfig, plain: Plan, message: str) -> Plan:
    if config.fallback == "raise":
        raise NoMatchError(f"no library entry matches: {message}")
    plain.reason = f"no-match: {message}"
    return plain
