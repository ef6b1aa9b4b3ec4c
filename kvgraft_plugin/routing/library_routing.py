"""A library's router: its embedder, its faiss index and a `Router` per routing setting, loaded on first use.

`kvgraft_plugin.routing.router` decides over any embed and search functions (unit-tested on fakes); this module
binds it to one library. The engine calls it on its worker thread only (torch and faiss run there).
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.core.exceptions import ConfigError, KVGraftError, LibraryError
from kvgraft_plugin.core.paths import cache_root
from kvgraft_plugin.library.aliases import Alias
from kvgraft_plugin.library.index import SINGLE_ENTRY_THRESHOLD, Embedder, Hit, VectorIndex, open_index
from kvgraft_plugin.library.library import Library, source_sha256
from kvgraft_plugin.library.store import MANIFEST
from kvgraft_plugin.library.template import Entry
from kvgraft_plugin.routing.deferred_judge import DeferredJudge
from kvgraft_plugin.routing.judge import (
    DEFAULT_THRESHOLD,
    JUDGE_PROMPT,
    VETO_THRESHOLD,
    Judge,
    JudgeVerdict,
    open_judge,
)
from kvgraft_plugin.routing.judge_exam import JudgeCheck, check_judge
from kvgraft_plugin.routing.router import DEFAULT_GUARDS, JUDGED_GUARDS, JudgeFn, Router, load_match_check
from kvgraft_plugin.routing.word_guards import signature

__all__ = ["LibraryRouting"]

logger = logging.getLogger(__name__)

#: How often at most a library's manifest is checked for changed aliases (`LibraryRouting.refresh`).
REFRESH_SECONDS = 1.0
#: How many routers (and deferred judges) are kept, one per distinct routing setting: requests may set their
#: own thresholds (`kvgraft_plugin.engine.request.request_config`), and each distinct one must not hold memory for
#: the life of the process. The least recently used goes first.
MAX_ROUTERS = 32


class LibraryRouting:
    """Routing over ``library`` (``None``: none loaded) with the settings of a request's config."""

    def __init__(
        self, library: Library | None, embedder: Embedder | str | Path | None = None, *, served: Path | None = None
    ) -> None:
        """``embedder``: a model name or path (default: the library's), or a ready `Embedder`. ``served``: the
        served model's GGUF when it is an instruct model (it has a chat template): the judge when no other is
        configured or calibrated and it passes `check_judge`."""
        self.library = library
        self.served = served
        self._embedder_name = embedder if embedder is None or isinstance(embedder, (str, Path)) else None
        self._embedder = None if embedder is None or isinstance(embedder, (str, Path)) else embedder
        self._index: VectorIndex | None = None
        self._routers: OrderedDict[tuple[Any, ...], Router] = OrderedDict()
        self._judges: dict[str, Judge] = {}
        self._unavailable: dict[str, str] = {}  # judges that cannot be opened here, and why (logged once)
        self._checked: dict[float, bool] = {}  # the served model's judge check, per threshold
        self._function_prompts: bool | None = None
        self.serving = False
        """Set once the engine serves requests: no judge model is opened after that (a request never waits for a
        model to load); a judge the engine did not open routes without a judge, and the trail says why."""
        self._deferred: OrderedDict[tuple[str, float, bool], DeferredJudge] = OrderedDict()
        self.aliases: dict[str, Alias] = _live_aliases(library)
        """The library's aliases whose entry still has the text that was judged; every router reads it."""
        self.revoked: dict[str, str] = dict(library.revoked) if library is not None else {}
        """The questions a user revoked, with their entry (`Library.revoked`); every router reads it."""
        self._refreshed, self._stamp = 0.0, self._manifest_stamp()
        self.key: bytes | None = None
        """The library's HMAC key, if one is configured: a changed manifest is read with it (`refresh`)."""
        self._checks: dict[tuple[str, float], JudgeCheck] = {}  # the named judges' checks

    def _manifest_stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = (self.library.path / MANIFEST).stat()  # type: ignore[union-attr]
        except (AttributeError, OSError):
            return None
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    @property
    def embedder(self) -> Embedder:
        """The library's sentence-transformers model (or the configured one), loaded on first use."""
        if self._embedder is None:
            self._embedder = Embedder.for_library(self.library, self._embedder_name)
        return self._embedder

    @property
    def index(self) -> VectorIndex | None:
        """The library's faiss index, loaded and checked on first use (``None`` without a library, or before
        a first build has written one)."""
        library = self.library
        if self._index is None and library is not None and library.entries and library.index:
            self._index = open_index(library, self.embedder)
        return self._index

    def warm_up(self) -> None:
        """Load torch, the embedder and the index now (not in the first request's time to first token).

        A broken index is only logged here: it is reported when routing needs it; plain decoding still works."""
        self.embed(["warm-up"])
        try:
            _ = self.index
        except LibraryError as exc:
            location = self.library.location if self.library is not None else None
            logger.warning("library %s cannot route until it is rebuilt: %s", location, exc)

    def reload(self) -> None:
        """Forget the loaded index and routers: the next request reads the library's index again."""
        self._index = None
        self._routers.clear()
        self._function_prompts = None
        self.aliases.clear()
        self.aliases.update(_live_aliases(self.library))
        self.revoked.clear()
        self.revoked.update(self.library.revoked if self.library is not None else {})
        self._stamp = self._manifest_stamp()

    def close(self) -> None:
        """Free the judges' models."""
        for judge in self._judges.values():
            judge.backend.close()
        self._judges.clear()
        self._routers.clear()

    def embed(self, texts: list[str]) -> np.ndarray:
        """L2-normalised embeddings of ``texts``."""
        return self.embedder.encode(texts)

    def search(self, question: str, k: int) -> list[Hit]:
        """The ``k`` entries nearest to ``question``, best first, no threshold applied. Nothing comes back from
        a library that failed its signature check: its text is not trusted."""
        library = self.library
        if library is not None and not library.trusted:
            logger.warning("search: library %s is not trusted (%s)", library.location, library.untrusted_reason)
            return []
        index = self.index
        return [] if index is None else index.search(self.embedder.encode([question])[0], k)

    def router(self, config: EngineConfig) -> Router | None:
        """The router for ``config``'s routing settings (``None`` without a non-empty indexed library)."""
        index, library = self.index, self.library
        if index is None or library is None:
            return None
        self.refresh()
        threshold, margin = self.threshold(config), self.margin(config)
        judged = self.judge(config)
        judge_threshold = judged[1] if judged is not None else self.judge_threshold(config)
        unavailable = self.unavailable(config) if judged is None else None
        key = (threshold, margin, config.neighbors, config.guards, config.match_check, judged and judged[1:],
               config.judge_mode, judge_threshold, unavailable)  # fmt: skip
        router = _recent(self._routers, key)
        if router is None:
            words = judged is None or judged[2] == "math"
            guards = DEFAULT_GUARDS if words else JUDGED_GUARDS
            router = Router(
                self.embedder.encode,
                lambda vector, k: [(h.entry_id, h.score) for h in index.search(vector, k)],
                {k: r.entry for k, r in library.entries.items()},
                threshold=threshold,
                margin=margin,
                neighbors=config.neighbors,
                guards=guards if config.guards else (),
                match_check=load_match_check(config.match_check),
                judge=None if judged is None else self._judge_fn(*judged[:2], config.judge_mode, judged[2] == "math"),
                aliases=self.aliases,
                judge_threshold=judge_threshold,
                revoked=self.revoked,
                first_sight=None if not config.guards else () if words else DEFAULT_GUARDS,
                unavailable=unavailable,
            )
            _keep(self._routers, key, router)
        return router

    def refresh(self) -> None:
        """Read the library's aliases and revocations again if its manifest changed on disk since they were read
        (another process approved or revoked some), at most once a second: a server sees them without a
        restart. A manifest that cannot be read now keeps what was read before."""
        library = self.library
        if library is None or time.monotonic() - self._refreshed < REFRESH_SECONDS:
            return
        self._refreshed = time.monotonic()
        try:
            stat = (library.path / MANIFEST).stat()
        except OSError:
            return
        stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if self._stamp is None or stamp == self._stamp:
            self._stamp = stamp
            return
        self._stamp = stamp
        fresh = library.read_aliases(self.key)
        if fresh is None:
            logger.warning("the changed manifest of %s is not read for its aliases", library.location)
            return
        library.aliases, library.revoked = fresh
        self.revoked.clear()
        self.revoked.update(library.revoked)
        self.aliases.clear()
        self.aliases.update(_live_aliases(library))

    def _judge_fn(self, judge: Judge, threshold: float, mode: str, vouched: bool) -> JudgeFn:
        """What the router asks: ``judge`` itself (``inline``), or a `DeferredJudge` over it (``async``);
        ``vouched``: behind the word guards, which read small edits and numbers (no clear Yes needed)."""
        if mode == "async":
            key = (judge.model_id, threshold, vouched)
            deferred = _recent(self._deferred, key)
            if deferred is None:
                deferred = DeferredJudge(judge, threshold, vouched=vouched)
                for dropped in _keep(self._deferred, key, deferred):
                    if dropped.pending:
                        logger.info("%d pairs waiting for a judgement at a setting no longer used", dropped.pending)
            return deferred

        def inline(entry: Entry, question: str, score: float) -> JudgeVerdict:
            try:
                return judge(entry.problem, question, answer=entry.answer, threshold=threshold, vouched=vouched)
            except KVGraftError as exc:  # a judge that fails mid-request refuses; the request goes on without it
                logger.warning("the judge %s failed: %s", judge.model_id, exc)
                return JudgeVerdict(math.nan, threshold, 0.0, cached=False, error=f"the judge failed ({exc})")

        return inline

    @property
    def pending(self) -> int:
        """Pairs waiting for a deferred judgement."""
        return sum(d.pending for d in self._deferred.values())

    def judge_deferred(self, key: bytes | None = None) -> Alias | None:
        """Judge one waiting pair now (on the worker); an approved one becomes an alias, routed from the next
        question on and stored in the library (signed again with ``key``; see `Library.add_aliases`)."""
        for (model, threshold, _), deferred in self._deferred.items():
            if deferred.pending:
                try:
                    if not self._may_approve(deferred.judge, threshold):
                        deferred.clear()
                        continue
                    alias = deferred.judge_next(model=model, prompt=JUDGE_PROMPT, entry_sha256=source_sha256)
                except KVGraftError as exc:  # a judge that fails is not asked again in this process
                    logger.warning("the judge %s failed: %s; its waiting pairs are dropped", model, exc)
                    deferred.clear()
                    continue
                if alias is None or self.revoked.get(alias.key) == alias.entry_id:
                    return None
                self.aliases[alias.key] = alias
                if self.library is not None:
                    self.library.add_aliases([alias], key=key)
                return alias
        return None

    def _may_approve(self, judge: Any, threshold: float) -> bool:
        """Whether ``judge`` may write aliases at ``threshold``: the library's calibrated judge may (its
        calibration measured it), and the served model passed its check before it was used; any other named
        judge is checked once (`check_judge`, cached per runtime), and one that fails writes nothing."""
        model = next((name for name, opened in self._judges.items() if opened is judge), None)
        recorded = self.library.routing.get("judge") if self.library is not None else None
        if isinstance(recorded, dict) and recorded.get("model") == model and recorded.get("prompt") == JUDGE_PROMPT:
            return True
        if model is None or (self.served is not None and model == str(self.served)):
            return model is not None
        check = self._checks.get((model, threshold))
        if check is None:
            check = self._checks[(model, threshold)] = check_judge(judge, threshold, cache_root() / "judge")
            if not check.passed:
                logger.warning("%s: its approvals are not stored as aliases", check.reason)
        return check.passed

    def judge(self, config: EngineConfig) -> tuple[Judge, float, str] | None:
        """The judge in force for ``config``: (judge, margin threshold, profile), or ``None``.

        The config's ``judge_model`` wins (``"off"``: none); else the library's calibrated judge, when its
        model is on this machine (when it is not, routing keeps the word guards, which fail closed, and says
        so in the log); else the served model, when it is an instruct model that passes the judge check. The
        threshold is the config's, else the library's for that model, prompt and profile, else the profile's:
        `VETO_THRESHOLD` behind the word guards (``math``), `DEFAULT_THRESHOLD` alone."""
        recorded = self.library.routing.get("judge") if self.library is not None else None
        recorded = recorded if isinstance(recorded, dict) else {}
        model = config.judge_model or recorded.get("model")
        if not model:
            return self._served_judge(config)
        if model == "off" or model in self._unavailable:
            return None
        judge = self._judges.get(model)
        if judge is None:
            if self._not_opened(model):
                return None
            try:
                judge = self._judges[model] = open_judge(model, n_threads=config.llama.n_threads)
            except KVGraftError as exc:
                if config.judge_model and isinstance(exc, ConfigError):
                    raise
                self._unavailable[model] = f"the judge {model} cannot be opened ({exc})"
                logger.warning("%s: routing without a judge", self._unavailable[model])
                return None
        threshold, profile = self._judge_setting(config, model)
        return judge, threshold, profile

    def judge_threshold(self, config: EngineConfig) -> float:
        """The judge margin in force for ``config``, whether or not a judge is opened: what an alias must have
        been approved at to graft."""
        recorded = self.library.routing.get("judge") if self.library is not None else None
        model = config.judge_model or (recorded.get("model") if isinstance(recorded, dict) else None)
        return self._judge_setting(config, model)[0]

    def unavailable(self, config: EngineConfig) -> str | None:
        """Why the judge in force for ``config`` could not be opened or checked here (``None``: it could, or
        none is configured): routing goes on without it, and every trail says why."""
        recorded = self.library.routing.get("judge") if self.library is not None else None
        model = config.judge_model or (recorded.get("model") if isinstance(recorded, dict) else None)
        return self._unavailable.get(str(model or self.served))

    def _not_opened(self, model: str) -> bool:
        """True (and why, in `unavailable`) when ``model`` would have to be opened while serving."""
        if not self.serving:
            return False
        self._unavailable[model] = f"the judge {model} was not opened with the engine (open the engine with it)"
        logger.warning("%s: routing without a judge", self._unavailable[model])
        return True

    def _judge_setting(self, config: EngineConfig, model: str | None) -> tuple[float, str]:
        """(margin threshold, profile) for judge ``model``: the config's, else the library's calibration of
        that model and prompt, else the profile's default."""
        recorded = self.library.routing.get("judge") if self.library is not None else None
        recorded = recorded if isinstance(recorded, dict) else {}
        same = model is not None and recorded.get("model") == model and recorded.get("prompt") == JUDGE_PROMPT
        profile = config.profile or (recorded.get("profile") if same else None) or "none"
        threshold = config.judge_threshold
        if threshold is None:
            calibrated = same and "threshold" in recorded and (recorded.get("profile") or "none") == profile
            threshold = float(recorded["threshold"]) if calibrated else _default_threshold(profile)
        return threshold, profile

    def _served_judge(self, config: EngineConfig) -> tuple[Judge, float, str] | None:
        """The served model as its own judge, when it is an instruct model that passes the judge check
        (checked once per model and runtime: `check_judge`) at the threshold in force; behind the word guards
        (``profile="math"``), at `DEFAULT_THRESHOLD`, since a veto's threshold lets near-misses through by
        design."""
        if self.served is None or self._all_function_prompts():
            return None
        profile = config.profile or "none"
        threshold = _default_threshold(profile) if config.judge_threshold is None else config.judge_threshold
        checked = DEFAULT_THRESHOLD if profile == "math" else threshold
        model = str(self.served)
        if self._checked.get(checked) is False:
            return None
        if model in self._unavailable:
            return None
        if model not in self._judges and self._not_opened(model):
            return None
        try:
            judge = self._judges.get(model)
            if judge is None:
                judge = self._judges[model] = open_judge(self.served, n_threads=config.llama.n_threads)
            check = check_judge(judge, checked, cache_root() / "judge") if checked not in self._checked else None
        except KVGraftError as exc:  # the served model as its judge is a bonus: routing goes on without it
            self._unavailable[model] = f"the served model cannot judge ({exc})"
            logger.warning("%s: routing without a judge", self._unavailable[model])
            return None
        if check is not None:
            self._checked[checked] = check.passed
            logger.info("%s%s", check.reason, "" if check.passed else ": routing without a judge")
            if not check.passed:
                self._judges.pop(model).backend.close()  # its context is freed; the weights are the engine's
                return None
        return judge, threshold, profile

    def _all_function_prompts(self) -> bool:
        """Every entry is a Python function prompt: the router reads those with its guards and never asks a
        judge (`Router._check`), so the served model is not opened and checked as one."""
        if self._function_prompts is None:
            entries = self.library.entries.values() if self.library is not None else ()
            self._function_prompts = bool(entries) and all(signature(r.entry.problem).function_prompt for r in entries)
        return self._function_prompts

    def explain(self, question: str, config: EngineConfig) -> list[tuple[str, float, str | None]]:
        """Every candidate the router considers for ``question``: (entry id, score, refusal or ``None``)."""
        router = self.router(config)
        if router is None:
            raise LibraryError("routing needs a library with entries and an index")
        return router.explain(question)

    def related(self, config: EngineConfig) -> tuple[bool, float, str]:
        """Whether the ``related`` route is on for ``config``, the similarity its entry needs, and why it is off:
        the config's ``related``, else the library's calibration (`kvgraft_plugin.tools.calibrate.calibrate_related`),
        else off. The threshold is the calibrated one, else the library's routing threshold."""
        recorded = self.library.routing.get("related") if self.library is not None else None
        recorded = recorded if isinstance(recorded, dict) else {}
        threshold = recorded.get("threshold")
        threshold = float(threshold) if isinstance(threshold, (int, float)) else self.threshold(config)
        if config.related is not None:
            return config.related, threshold, "off by the setting related=False"
        if recorded.get("on") is True:
            return True, threshold, ""
        why = recorded.get("why")
        return False, threshold, str(why) if why else "not calibrated on this library (kvgraft calibrate --related)"

    def margin(self, config: EngineConfig) -> float:
        """The score margin in force: the config's, else the library's (0 = off)."""
        if config.margin is not None:
            return config.margin
        return float(self.library.routing.get("margin") or 0.0) if self.library is not None else 0.0

    def threshold(self, config: EngineConfig) -> float:
        """The similarity threshold in force: the config's, else the library's (calibrated or derived at build)."""
        if config.threshold is not None:
            return config.threshold
        if self.library is not None and self.library.threshold is not None:
            return float(self.library.threshold)
        return SINGLE_ENTRY_THRESHOLD


def _recent(cache: OrderedDict[Any, Any], key: Any) -> Any:
    """``cache[key]``, marked as the most recently used (``None``: absent)."""
    if key in cache:
        cache.move_to_end(key)
    return cache.get(key)


def _keep(cache: OrderedDict[Any, Any], key: Any, value: Any) -> list[Any]:
    """Store ``value`` under ``key`` as the most recently used; the values dropped to keep `MAX_ROUTERS`."""
    cache[key] = value
    return [cache.popitem(last=False)[1] for _ in range(len(cache) - MAX_ROUTERS)]


def _default_threshold(profile: str) -> float:
    """The judge's margin threshold where none is configured or calibrated for ``profile``."""
    return VETO_THRESHOLD if profile == "math" else DEFAULT_THRESHOLD


def _live_aliases(library: Library | None) -> dict[str, Alias]:
    """The aliases of ``library`` whose entry's text is still the text that was judged."""
    if library is None:
        return {}
    return {
        k: a for k, a in library.aliases.items()
        if a.entry_id in library.entries and a.entry_sha256 == source_sha256(library.entries[a.entry_id].entry)
    }  # fmt: skip
