"""The graft engine: query -> embed -> match -> restore -> decode -> answer, in one place.

`GraftEngine.stream` is the data path; every other entry point (`ask`, the CLI, the LangChain
classes) goes through it. Each step is one call into its layer: `Embedder`/`VectorIndex` (match),
`Library` (checked state bytes), `LlamaBackend` (restore, prefill, decode).

Thread safety: one engine owns one llama.cpp context and one worker thread. Every request runs on that
thread, whole and in arrival order, and streams its text back through a queue. Concurrent callers
therefore get exactly the outputs they would get serially, and llama.cpp's and torch's OpenMP pools
always run on the same thread: calling them from many threads left idle pools spinning and cost 39%
of throughput here. An abandoned stream is cancelled at its next token. Run one engine per process
for parallel throughput.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ._backend import Backend
from ._config import KV_TYPES, DecodeMode, EngineConfig, LlamaConfig, RouteMode
from ._decode import DecodeStats, Drafter, lookup_tokens, step_tokens
from ._exceptions import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    EngineClosedError,
    IncompatibleStateError,
    IntegrityError,
    LibraryError,
    NoMatchError,
    QueryError,
    StateError,
)
from ._fingerprint import MUST_MATCH, PREFILL_CHUNKING
from ._index import SINGLE_ENTRY_THRESHOLD, Embedder, Hit, VectorIndex, open_index
from ._invariance import InvarianceReport, measure, recall, remember
from ._library import BaseStateCache, EntryRecord, Library, RamStateCache, load_key, source_sha256, visible
from ._models import bundled_model_path, file_sha256, resolve_model
from ._router import DEFAULT_GUARDS, GuardVerdict, NoMatch, Router, load_match_check
from ._sampling import SAMPLING_FIELDS, SamplingParams
from ._state import FORMAT_VERSION, SavedState
from ._template import AnswerFormat, Entry, Prompt, Template, TemplateKind, make_template
from .adapters.llama_cpp import LlamaBackend, inspect_seq_state, llama_cpp_version, tiled_matmul

__all__ = ["Capture", "GraftChunk", "GraftEngine", "GraftResult"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

ROUTES = ("graft", "text-rag", "plain")
#: Settings a request may override (``stream(routing=...)``): they change the route, never the KV bytes.
ROUTING_SETTINGS = frozenset({"threshold", "margin", "neighbors", "guards", "match_check", "fallback"})
FALLBACK_CODES = ("no-match", "integrity", "incompatible", "inexact", "too-long", "unsigned", "missing")


@dataclass
class GraftResult:
    """The answer and how it was produced. `to_json` gives the CLI's ``--json`` object."""

    text: str
    route: str
    """``"graft"``, ``"text-rag"`` or ``"plain"``: the route actually taken."""
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


@dataclass
class _Plan:
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


class GraftEngine:
    """A frozen llama.cpp model plus a library of grafted solved problems.

    Args:
        library: library folder or fsspec URL (built by ``kvgraft build``), or ``None`` for plain decoding
            only. A URL is mirrored under ``cache_dir``; its states are fetched on first use.
        config: full configuration; keyword ``overrides`` are applied on top of it. Any
            `LlamaConfig` field (``n_ctx``, ``n_threads``, ``n_gpu_layers``, ``model_path``...) and any
            `EngineConfig` field (``threshold``, ``neighbors``, ``max_tokens``, ``key_file``...) is accepted.
        state_cache: where verified state bytes are kept between requests; an LRU of
            ``config.cache_bytes`` by default.
        backend: a ready model runtime (see `Backend`) instead of loading ``model_path`` with llama.cpp;
            for tests and other runtimes. The engine closes it.

    The backend is touched by the worker thread only. Tools (build, verify, doctor, bench) use the public
    methods below, which run there between requests: `tokenize`, `capture`, `restore_diff`, and
    `run_exclusive` for measurements that need the backend itself.
    """

    def __init__(
        self,
        library: str | Path | Library | None = None,
        *,
        config: EngineConfig | None = None,
        state_cache: BaseStateCache | None = None,
        backend: Backend | None = None,
        **overrides: Any,
    ) -> None:
        self.config = (config or EngineConfig()).with_settings(**overrides)
        key = load_key(self.config.key_file) if self.config.key_file else None
        if isinstance(library, Library) and key is not None:
            library = Library.open(library.location, key=key, **self._mirror())  # a key applies however opened
        if library is not None and not isinstance(library, Library):
            library = Library.open(library, key=key, **self._mirror())
        self.library = library
        if self.library is not None and self.library.trusted and config is None:
            self.config = self.config.replace(llama=_library_settings(self.library, self.config.llama, overrides))
        self.backend: Backend = backend or LlamaBackend(self._resolve_model_path(), self.config.llama)
        """The runtime. Call it only on the worker thread: from tools, through `run_exclusive`."""
        model_path = self.backend.model_path
        self.answer_format: AnswerFormat = self.config.answer_format or (
            self.library.answer_format if self.library is not None else "answer"
        )
        """How answers are shown and decoded: the config's, else the library's."""
        kind: TemplateKind = self.config.template or (self.library.template if self.library is not None else "text")
        chat_name = self.config.chat_template or (self.library.chat_template if self.library is not None else None)
        self.template: Template = make_template(
            kind, self.answer_format, render=self._render_chat(chat_name), chat_name=chat_name
        )
        """How every route's tokens are laid out (`kvgraft_plugin._template`): the config's, else the library's."""
        self._closed = False
        self._worker_thread: threading.Thread | None = None
        self._worker = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="kvgraft", initializer=self._mark_worker_thread
        )
        self._embedder: Embedder | None = None
        self._index: VectorIndex | None = None
        self._routers: dict[tuple[Any, ...], Router] = {}
        self._lookup_batch_size: int | None = None
        self.state_cache = state_cache if state_cache is not None else RamStateCache(self.config.cache_bytes)
        try:
            self.model_sha256 = file_sha256(model_path)
            self.fingerprint = self._make_fingerprint()
            self._preamble_tokens = self._on_worker(lambda: self._tokens(self.template.preamble(), add_bos=True))
            if self.config.decode != "step" and not self.backend.layout.recurrent:
                self._on_worker(lambda: self.lookup_batch)  # measured once per build and model, not in a TTFT
            if self.library is not None and self.library.trusted and self.library.entries:
                self._on_worker(self._warm_up)
        except BaseException:
            self.close()  # nothing leaks when the constructor fails after loading the model
            raise

    def _mirror(self) -> dict[str, Any]:
        """Where and how much of a library at a URL is kept locally."""
        return {"cache_dir": self.config.cache_dir, "cache_bytes": self.config.disk_cache_bytes}

    def _mark_worker_thread(self) -> None:
        self._worker_thread = threading.current_thread()

    def _warm_up(self) -> None:
        """Load torch, the embedder and the index now, on the worker thread, not in the first TTFT.

        A broken index is reported when routing needs it; plain decoding still works."""
        self.embedder.encode(["warm-up"])
        try:
            _ = self.index
        except LibraryError as exc:
            logger.warning("library %s cannot route until it is rebuilt: %s", self.library.location, exc)  # type: ignore[union-attr]

    # -- setup ----------------------------------------------------------------------------------------

    def _resolve_model_path(self) -> Path:
        if self.config.llama.model_path:
            return resolve_model(self.config.llama.model_path)
        remembered = remembered_model_path(self.library.model) if self.library is not None else None
        return remembered or bundled_model_path()

    def _make_fingerprint(self) -> dict[str, Any]:
        """Everything that changes the KV bytes, their layout, or how later tokens are computed
        (`_fingerprint.MUST_MATCH`); settings measured harmless are left out."""
        import llama_cpp

        llama = self.config.llama
        return {
            "format": FORMAT_VERSION,
            "template": self.template.name,
            "gguf_sha256": self.model_sha256,
            "llama_cpp_python": llama_cpp_version(),
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "tiled_matmul": tiled_matmul(),
            "arch": self.backend.arch,
            "device": self.backend.device(),
            "prefill_chunking": PREFILL_CHUNKING,
            **{name: getattr(llama, name) for name in MUST_MATCH},
            "n_seq_max": 1,
        }

    @property
    def embedder(self) -> Embedder:
        """The sentence-transformers model, loaded on first use."""
        if self._embedder is None:
            self._embedder = Embedder.for_library(self.library, self.config.embedder)
        return self._embedder

    @property
    def index(self) -> VectorIndex | None:
        """The library's faiss index, loaded and checked on first use (``None`` without a library, or before
        a first build has written one)."""
        if self._index is None and self.library is not None and self.library.entries and self.library.index:
            self._index = open_index(self.library, self.embedder)
        return self._index

    def reload_index(self) -> None:
        """Forget the loaded index and routers: the next request reads the library's index again."""
        self._index = None
        self._routers.clear()

    @property
    def router(self) -> Router | None:
        """The router over the library's index with the engine's settings (``None`` without a non-empty library)."""
        return self._router_for(self.config)

    def _router_for(self, config: EngineConfig) -> Router | None:
        index = self.index
        if index is None or self.library is None:
            return None
        threshold, margin = self._threshold(config), self._margin(config)
        key = (threshold, margin, config.neighbors, config.guards, config.match_check)
        router = self._routers.get(key)
        if router is None:
            entries = {k: r.entry for k, r in self.library.entries.items()}
            router = self._routers[key] = Router(
                self.embedder.encode,
                lambda vector, k: [(h.entry_id, h.score) for h in index.search(vector, k)],
                entries,
                threshold=threshold,
                margin=margin,
                neighbors=config.neighbors,
                guards=DEFAULT_GUARDS if config.guards else (),
                match_check=load_match_check(config.match_check),
            )
        return router

    @property
    def margin(self) -> float:
        """The score margin in force: the config's, else the library's (0 = off)."""
        return self._margin(self.config)

    @property
    def threshold(self) -> float:
        """The similarity threshold in force: the config's, else the library's (calibrated or derived at build)."""
        return self._threshold(self.config)

    def _margin(self, config: EngineConfig) -> float:
        if config.margin is not None:
            return config.margin
        return float(self.library.routing.get("margin") or 0.0) if self.library is not None else 0.0

    def _threshold(self, config: EngineConfig) -> float:
        if config.threshold is not None:
            return config.threshold
        if self.library is not None and self.library.threshold is not None:
            return float(self.library.threshold)
        return SINGLE_ENTRY_THRESHOLD

    # -- tools' API: each call runs on the worker thread, between requests ----------------------------

    @property
    def model_path(self) -> Path:
        """The GGUF file in use."""
        return self.backend.model_path

    @property
    def n_ctx(self) -> int:
        """The context length of the llama.cpp context."""
        return self.backend.n_ctx

    @property
    def n_swa(self) -> int:
        """The model's sliding-window size (0: dense)."""
        return self.backend.n_swa

    @property
    def n_vocab(self) -> int:
        """Vocabulary size."""
        return self.backend.n_vocab

    def run_exclusive(self, fn: Callable[[Backend], T]) -> T:
        """``fn(backend)`` on the worker thread, between requests, with an empty cache afterwards.

        For measurements (``kvgraft bench-graft``, ``kvgraft doctor``) that time or probe the runtime itself.
        """
        self._check_open()

        def run() -> T:
            try:
                return fn(self.backend)
            finally:
                self.backend.reset()

        return self._on_worker(run)

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``."""
        return self._on_worker(lambda: self.backend.tokenize(text, add_bos=add_bos))

    def _tokens(self, prompt: Prompt, *, add_bos: bool = False) -> list[int]:
        """A template's segments tokenized one by one (on the worker): markup with special tokens, text without."""
        tokens: list[int] = []
        for i, segment in enumerate(prompt):
            tokens += self.backend.tokenize(segment.text, add_bos=add_bos and i == 0, special=segment.special)
        return tokens

    def _render_chat(self, name: str | None) -> Callable[[Sequence[tuple[str, str]], bool], str]:
        def render(messages: Sequence[tuple[str, str]], add_generation_prompt: bool) -> str:
            return self.backend.render_chat(messages, add_generation_prompt=add_generation_prompt, name=name)

        return render

    def prefix_tokens(self, record_or_entry: Any) -> list[int]:
        """Token ids of the graft prefix (preamble + entry) for an entry."""
        entry = getattr(record_or_entry, "entry", record_or_entry)
        return self._on_worker(lambda: self._tokens(self.template.prefix(entry), add_bos=True))

    def probe_tokens(self, entry: Entry) -> list[int]:
        """The query suffix that asks ``entry``'s own problem: the probe of every restore check."""
        return self._on_worker(lambda: self._tokens(self.template.query(entry.problem, same_as=entry)))

    def capture(
        self, tokens: Sequence[int], *, probe: Sequence[int] | None = None, restore: bytes | None = None
    ) -> Capture:
        """Prefill ``tokens`` from an empty cache and save the sequence's state.

        With ``probe``, also check that restoring the state (or the bytes ``restore``, saved elsewhere for the
        same tokens) and prefilling ``probe`` gives bitwise the logits of the fresh prefill followed by
        ``probe``. A model whose state layout kvgraft does not know, or has not proven exact, is refused here
        (`ConfigError` from the backend), so a build fails before its first entry instead of its library
        falling back on every request.
        """

        def run(backend: Backend) -> Capture:
            backend.reset()
            backend.prefill(tokens)
            payload = backend.capture_state()
            restored = payload if restore is None else bytearray(restore)
            diff = None if probe is None else _restore_diff(backend, tokens, restored, probe, prefilled=True)
            return Capture(payload, diff)

        return self.run_exclusive(run)

    def restore_diff(self, tokens: Sequence[int], payload: bytearray, probe: Sequence[int]) -> float:
        """Max |logit diff| of ``probe`` after restoring ``payload`` vs after prefilling ``tokens`` afresh:
        0.0 when bitwise equal, NaN when unequal without a finite gap."""
        return self.run_exclusive(lambda backend: _restore_diff(backend, tokens, payload, probe))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised embeddings of ``texts`` by the library's embedder."""
        return self._on_worker(lambda: self.embedder.encode(list(texts)))

    def explain(self, question: str) -> list[tuple[str, float, str | None]]:
        """Every candidate the router considers for ``question``: (entry id, score, refusal or ``None``)."""
        check_question(question)

        def run() -> list[tuple[str, float, str | None]]:
            router = self.router
            if router is None:
                raise LibraryError("routing needs a library with entries and an index")
            return router.explain(question)

        return self._on_worker(run)

    def validate_state(self, state: SavedState, record: EntryRecord) -> None:
        """The checks made on a state before its first use: its ids are exactly what text RAG feeds for the
        entry, and its bytes are well formed for this runtime (`StateError` if not)."""
        self._on_worker(lambda: self._validate_payload(state, record))

    def _on_worker(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._worker_thread:
            return fn()  # already on the worker (inside a request or a tool call)
        self._check_open()
        return self._worker.submit(fn).result()

    # -- public API -----------------------------------------------------------------------------------

    def search(self, question: str, k: int | None = None) -> list[Hit]:
        """The ``k`` library entries nearest to ``question``, best first (no threshold applied).

        Nothing comes back from a library that failed its signature check: its text is not trusted."""
        check_question(question)
        self._check_open()
        if self.library is not None and not self.library.trusted:
            logger.warning(
                "search: library %s is not trusted (%s)", self.library.location, self.library.untrusted_reason
            )
            return []

        def run() -> list[Hit]:
            index = self.index
            if index is None:
                return []
            return index.search(self.embedder.encode([question])[0], k or self.config.neighbors)

        return self._on_worker(run)

    def ask(self, question: str, **kwargs: Any) -> GraftResult:
        """Answer ``question``; keyword arguments as for `stream`."""
        result = None
        for chunk in self.stream(question, **kwargs):
            result = chunk.result or result
        assert result is not None  # stream always ends with a result
        return result

    def stream(
        self,
        question: str,
        *,
        mode: RouteMode = "auto",
        entry_id: str | None = None,
        max_tokens: int | None = None,
        stop: tuple[str, ...] | list[str] | None = None,
        system: str | None = None,
        history: Sequence[tuple[str, str]] = (),
        routing: Mapping[str, Any] | None = None,
        cancel: threading.Event | None = None,
        decode: DecodeMode | None = None,
        sampling: SamplingParams | None = None,
        **sampling_fields: Any,
    ) -> Iterator[GraftChunk]:
        """Answer ``question``, yielding text as it is decoded; the last chunk carries the result.

        ``mode``: ``auto`` routes and grafts when it can, falling back to text RAG (unusable state)
        or plain decoding (no match, too long); ``graft``/``text-rag`` force a route for the matched
        (or ``entry_id``) entry; ``plain`` never uses the library. ``system`` and ``history`` (earlier
        question/answer turns) are rendered into the suffix; routing uses ``question`` alone.
        ``routing`` overrides `ROUTING_SETTINGS` (``threshold``, ``margin``, ``neighbors``, ``guards``,
        ``match_check``, ``fallback``) for this request only. Setting ``cancel`` (from any thread) stops
        decoding at the next token, as closing the iterator does; the result then ends there.
        ``sampling`` (default: the config's) chooses the tokens; any of its fields given as a keyword
        (``temperature=0.8, seed=3, top_p=0.9, repeat_penalty=1.1, grammar=...``) overrides it. With a
        grammar and no ``stop``, decoding ends where the grammar does. ``decode`` (default: the config's)
        picks the decoder, ``step`` or ``lookup`` (``auto``: lookup where proven exact); the tokens are the same.
        """
        self._check_open()
        config = self._request_config(routing)
        if mode not in ("auto", *ROUTES):
            raise ConfigError(f"mode must be one of auto, graft, text-rag, plain; got {mode!r}")
        check_question(question)
        budget = max_tokens if max_tokens is not None else self.config.max_tokens
        if budget < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {budget}")
        unknown = set(sampling_fields) - SAMPLING_FIELDS
        if unknown:
            raise ConfigError(f"unknown keyword arguments: {sorted(unknown)}")
        params = (sampling or self.config.sampling).replace(**sampling_fields)
        if stop is None:
            stop = () if params.grammar is not None and self.config.stop is None else self._default_stop(question)
        decode = decode or self.config.decode
        if decode not in ("auto", "step", "lookup"):
            raise ConfigError(f"decode must be 'auto', 'step' or 'lookup', got {decode!r}")
        settings = {"max_tokens": budget, "stop": tuple(s for s in stop if s), "sampling": params, "decode": decode}
        chunks: queue.SimpleQueue[GraftChunk | BaseException | None] = queue.SimpleQueue()
        cancel = cancel if cancel is not None else threading.Event()

        def produce() -> None:
            try:
                for chunk in self._run(question, config, mode, entry_id, system, history, cancel, **settings):
                    chunks.put(chunk)
            except BaseException as exc:  # handed to the caller's thread, raised there
                chunks.put(exc)
            finally:
                chunks.put(None)

        self._worker.submit(produce)
        try:
            while (item := chunks.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()

    # -- the data path ----------------------------------------------------------------------------------

    def _default_stop(self, question: str) -> tuple[str, ...]:
        return self.config.stop if self.config.stop is not None else self.template.stop(question)

    def _request_config(self, routing: Mapping[str, Any] | None) -> EngineConfig:
        if not routing:
            return self.config
        unknown = set(routing) - ROUTING_SETTINGS
        if unknown:
            raise ConfigError(
                f"not a per-request routing setting: {sorted(unknown)} (allowed: {sorted(ROUTING_SETTINGS)})"
            )
        return self.config.with_settings(**routing)

    def _run(
        self,
        question: str,
        config: EngineConfig,
        mode: str,
        entry_id: str | None,
        system: str | None,
        history: Sequence[tuple[str, str]],
        cancel: threading.Event,
        **settings: Any,
    ) -> Iterator[GraftChunk]:
        """One request, on the worker thread: route, restore or prefill, decode."""
        start = time.perf_counter()
        phases: dict[str, float] = {}

        def suffix(entry: Entry | None) -> list[int]:
            return self._tokens(self.template.query(question, system=system, history=history, same_as=entry))

        plan = self._plan(question, config, suffix, mode, entry_id, settings["max_tokens"], phases)
        lookup_batch = self._lookup_batch(settings.pop("decode"), plan)
        try:
            self._prefill(plan, phases)
        except BackendError as exc:
            if plan.state is None or plan.record is None:
                raise
            # llama.cpp refused the bytes: forget them, and serve the entry by text RAG
            assert self.library is not None
            self.state_cache.discard(self.library.cache_key(plan.record))
            logger.warning("restore of %s refused by llama.cpp: %s", plan.record.id, exc)
            plan = dataclasses.replace(
                plan,
                route="text-rag",
                tokens=self.prefix_tokens(plan.record) + plan.tokens,
                state=None,
                reason=f"integrity: llama.cpp refused the state of {plan.record.id} ({exc})",
            )
            self._prefill(plan, phases)
        if plan.max_tokens is not None:
            settings["max_tokens"] = plan.max_tokens
        # the sampler's history is the whole context, restored or prefilled: the same ids on every route
        context = list(plan.state.tokens) + plan.tokens if plan.state is not None else plan.tokens
        sampler = self.backend.sampler(settings.pop("sampling"), context)
        limit = min(settings.pop("max_tokens"), self.backend.n_ctx - self.backend.n_past)
        stats = DecodeStats()
        if lookup_batch > 1:
            # drafts come from the entry first: the prefix restored or prefilled before the query suffix
            n_entry = len(context) - plan.n_suffix if plan.route != "plain" else 0
            drafter = Drafter(context[:n_entry], context[n_entry:], self._ends_decoding(settings["stop"]))
            tokens = lookup_tokens(self.backend, sampler, limit, drafter, lookup_batch, stats)
        else:
            tokens = step_tokens(self.backend, sampler, limit)
        try:
            yield from self._decode(
                plan, tokens, stats, "lookup" if lookup_batch > 1 else "step",
                start=start, phases=phases, cancel=cancel, **settings,
            )  # fmt: skip
        finally:
            tokens.close()
            sampler.close()

    def _ends_decoding(self, stop: tuple[str, ...]) -> Callable[[int], bool]:
        """Whether a token ends decoding by itself: an end-of-generation token, or one holding a stop string."""
        backend = self.backend

        def ends(token: int) -> bool:
            piece = backend.token_bytes(token).decode("utf-8", errors="ignore")
            return backend.is_eog(token) or any(s in piece for s in stop)

        return ends

    def _lookup_batch(self, decode: str, plan: _Plan) -> int:
        """The largest batch lookup decoding may verify for this request: 1 means step decoding. Called
        before the prefill, since a first measurement clears the cache."""
        if decode == "step":
            return 1
        if self.backend.layout.recurrent:
            reason = f"a recurrent ({self.backend.arch}) model cannot drop rejected draft tokens"
            batch = 1
        else:
            batch = self.lookup_batch
            reason = "batches are not proven bitwise equal to one-token steps on this build, model and settings"
        if batch < 2 and decode == "lookup":
            plan.notes.append(f"lookup decoding not used: {reason} (kvgraft doctor --invariance)")
        return batch if batch > 1 else 1

    @property
    def lookup_batch(self) -> int:
        """The largest batch proven bitwise equal to one-token steps here (1: none is). Measured once per
        build, model, settings and thread count (`measure_invariance`), then read from the cache."""
        if self._lookup_batch_size is None:
            remembered = recall(self._invariance_key())
            self._lookup_batch_size = remembered if remembered is not None else self.measure_invariance().max_batch
        return self._lookup_batch_size

    def measure_invariance(self) -> InvarianceReport:
        """Measure batch invariance now (a second or two; `kvgraft_plugin._invariance`), remember it for
        this fingerprint and use it for lookup decoding."""
        report = self.run_exclusive(measure)
        logger.info("batch invariance measured: lookup decoding may verify %d tokens at once", report.max_batch)
        remember(self._invariance_key(), report)
        self._lookup_batch_size = report.max_batch
        return report

    def _invariance_key(self) -> dict[str, Any]:
        key = {k: v for k, v in self.fingerprint.items() if k not in ("format", "template", "prefill_chunking")}
        return {**key, "n_threads": self.config.llama.n_threads}

    def _plan(
        self,
        question: str,
        config: EngineConfig,
        render: Callable[[Entry | None], list[int]],
        mode: str,
        entry_id: str | None,
        budget: int,
        phases: dict[str, float],
    ) -> _Plan:
        """Decide the route: match an entry, check it fits and its state is usable, or fall back.

        ``render(entry)`` gives the query suffix's tokens: a route that uses an entry restates the entry's
        problem in it (the same on graft and text RAG), which makes the small model copy the verified
        answer for a reworded question instead of re-deriving it.
        """
        plain_suffix = render(None)
        plain = _Plan("plain", self._preamble_tokens + plain_suffix, len(plain_suffix))
        if len(plain.tokens) >= self.backend.n_ctx:
            raise ContextOverflowError(f"the query needs {len(plain.tokens)} tokens; n_ctx is {self.backend.n_ctx}")
        if mode == "plain":
            return plain
        library = self.library
        if library is None:
            if mode != "auto" or entry_id is not None:
                raise LibraryError("no library is loaded")
            return _no_match(config, plain, "no library is loaded")
        if not library.trusted:
            plain.reason = f"unsigned: {library.untrusted_reason}"
            return plain

        # match
        score: float | None = None
        if entry_id is not None:
            record = library.get(entry_id)
        else:
            router = self._router_for(config)
            if router is None:
                return _no_match(config, plain, "the library has no entries or no index yet (rerun kvgraft build)")
            decision = router.route(question)
            phases.update(decision.phases_ms)
            plain.trail = decision.trail
            if isinstance(decision, NoMatch):
                return _no_match(config, plain, decision.reason)
            record, score = library.get(decision.entry_id), decision.score

        if source_sha256(record.entry) != record.source_sha256:
            # text that fails its check never reaches a prompt, on any route
            plain.reason = f"integrity: the text of entry {record.id!r} changed after it was built"
            return plain
        suffix = render(record.entry)
        room = self.backend.n_ctx - len(record.tokens) - len(suffix)
        if room < 1:
            plain.reason = f"too-long: entry {record.id} + query exceed n_ctx={self.backend.n_ctx}"
            return plain
        notes = []
        if budget > room:
            notes.append(f"max_tokens {budget} capped at {room}: what fits after entry {record.id} in n_ctx")
            budget = room

        def text_rag(reason: str | None = None) -> _Plan:
            # rendered from the entry's text (checked above), so a damaged state cannot change the prompt
            tokens = self.prefix_tokens(record) + suffix
            return _Plan(
                "text-rag", tokens, len(suffix), record, score=score, reason=reason, trail=plain.trail,
                max_tokens=budget, notes=notes,
            )  # fmt: skip

        if mode == "text-rag":
            return text_rag()

        # the state: checked before its first use in this process, then cached
        t0 = time.perf_counter()
        try:
            state = library.load_state(
                record, self.fingerprint, self.state_cache, lambda state: self._validate_payload(state, record)
            )
        except FileNotFoundError:
            return text_rag(f"missing: state file of {record.id} not found")
        except OSError as exc:
            return text_rag(f"missing: state file of {record.id} cannot be read ({exc.strerror or exc})")
        except StateError as exc:
            logger.warning("entry %s falls back to text RAG: %s", record.id, exc)
            return text_rag(f"{exc.reason}: {exc}")
        finally:
            phases["check"] = _ms(t0, time.perf_counter())
        return _Plan(
            "graft", suffix, len(suffix), record, state, score, trail=plain.trail, max_tokens=budget, notes=notes
        )

    def _validate_payload(self, state: SavedState, record: EntryRecord) -> None:
        """Checks made once per process before a state is cached: its ids are exactly the ids text RAG
        would feed for the entry, and its llama.cpp bytes are well formed for this runtime."""
        if list(state.tokens) != self.prefix_tokens(record):
            raise IntegrityError(f"state of {record.id!r} holds other token ids than its text renders to")
        info = inspect_seq_state(state.payload, self.backend.layout)
        if info.n_tokens != len(state.tokens):
            raise IntegrityError(f"state holds {info.n_tokens} positions for {len(state.tokens)} tokens")
        llama = self.config.llama
        if not set(info.k_types) <= {KV_TYPES[llama.type_k]} or not set(info.v_types) <= {KV_TYPES[llama.type_v]}:
            raise IncompatibleStateError(f"state KV types {info.k_types}/{info.v_types} differ from the runtime's")

    def _prefill(self, plan: _Plan, phases: dict[str, float]) -> None:
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
        phases["restore"] = _ms(t0, t1)
        phases["prefill"] = _ms(t1, time.perf_counter())

    def _decode(
        self,
        plan: _Plan,
        tokens: Iterator[int],
        stats: DecodeStats,
        decoder_name: str,
        *,
        start: float,
        phases: dict[str, float],
        cancel: threading.Event,
        stop: tuple[str, ...],
    ) -> Iterator[GraftChunk]:
        """Turn the decoder's tokens into text until a stop string, an end-of-generation token, the budget
        or the context ends."""
        backend = self.backend
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text, final, emitted, n_decoded, ttft = "", "", 0, 0, 0.0
        finish = "length"
        t_first = time.perf_counter()
        for token in tokens:
            n_decoded += 1
            if n_decoded == 1:
                ttft = _ms(start, time.perf_counter())
                phases["first_token"] = _ms(t_first, time.perf_counter())
            if backend.is_eog(token):
                finish = "eog"
                break
            text += decoder.decode(backend.token_bytes(token))
            # a stop string only counts in the text proper (after an answer's leading whitespace)
            final = self.template.trim(text)
            cut = min((i for s in stop if (i := final.find(s)) >= 0), default=-1)
            if cut >= 0:
                final, finish = final[:cut], "stop"
            safe = len(final) if cut >= 0 else len(final) - _held_back(final, stop)
            if safe > emitted:
                yield GraftChunk(final[emitted:safe])
                emitted = safe
            if cut >= 0 or cancel.is_set():
                break
        if finish == "length" and cancel.is_set():
            finish = "cancelled"
        if finish != "stop":
            final = self.template.trim(text + decoder.decode(b"", final=True))
            if len(final) > emitted:
                yield GraftChunk(final[emitted:])
        end = time.perf_counter()
        phases["decode"] = _ms(t_first, end)
        if not ttft:
            ttft = _ms(start, end)
        record = plan.record if plan.route != "plain" else None
        yield GraftChunk(
            "",
            GraftResult(
                text=final,
                route=plan.route,
                entry_id=record.id if record else None,
                score=round(plan.score, 6) if record and plan.score is not None else None,
                fallback_reason=plan.reason,
                prefill_tokens=len(plan.tokens),
                restored_tokens=len(plan.state.tokens) if plan.state is not None else 0,
                decode_tokens=n_decoded,
                ttft_ms=ttft,
                total_ms=_ms(start, end),
                decode=decoder_name,
                decode_ms=round(phases["decode"], 3),
                drafted_tokens=stats.drafted,
                accepted_tokens=stats.accepted,
                finish_reason=finish,
                phases_ms={k: round(v, 3) for k, v in phases.items()},
                match=[v.to_json() for v in plan.trail],
                notes=list(plan.notes),
            ),
        )

    def close(self) -> None:
        """Finish queued requests, then free the llama.cpp context and model. Closing twice is harmless;
        any other call after it raises `EngineClosedError`."""
        if self._closed:
            return
        self._closed = True
        try:
            self._worker.submit(self.backend.close).result()
        except RuntimeError:  # the interpreter is exiting and takes no new work: no request can be running
            self.backend.close()
        self._worker.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this GraftEngine is closed")

    def __enter__(self) -> GraftEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- helpers --------------------------------------------------------------------------------------------


def _library_settings(library: Library, llama: LlamaConfig, explicit: Mapping[str, Any]) -> LlamaConfig:
    """``llama`` with the library's must-match settings wherever the caller did not set one; a setting the
    caller set to another value is reported once (its states will then be served by text RAG)."""
    adopted: dict[str, Any] = {}
    for name in MUST_MATCH:
        if name not in library.fingerprint or name == "model_path":
            continue
        built = library.fingerprint[name]
        if explicit.get(name) is None:
            adopted[name] = built
        elif explicit[name] != built:
            logger.warning(
                "%s=%r differs from the library's %r: its states will not be grafted (text RAG serves them)",
                name,
                explicit[name],
                built,
            )
    try:
        return llama.replace(**adopted)
    except (ConfigError, TypeError) as exc:  # a damaged manifest: its states will be refused as incompatible
        logger.warning("the library's pinned settings cannot be used (%s); keeping this engine's", exc)
        return llama


def _no_match(config: EngineConfig, plain: _Plan, message: str) -> _Plan:
    if config.fallback == "raise":
        raise NoMatchError(f"no library entry matches: {message}")
    plain.reason = f"no-match: {message}"
    return plain


def remembered_model_path(model: Mapping[str, Any]) -> Path | None:
    """The model a library was built with (its manifest's ``model`` record), on this machine."""
    if name := model.get("name") or model.get("bundled"):
        return resolve_model(name)
    return Path(model["path"]) if model.get("path") else None


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


def _restore_diff(
    backend: Backend, tokens: Sequence[int], payload: Any, probe: Sequence[int], *, prefilled: bool = False
) -> float:
    """Max |logit diff| between prefill(tokens) + probe and restore(payload) + probe; 0.0 when bitwise equal.

    The reference is always a fresh prefill (``prefilled=True``: the backend holds exactly ``tokens``,
    freshly prefilled, as right after a capture). Nothing is rolled back on a sliding-window cache.
    """
    if not prefilled:
        backend.reset()
        backend.prefill(tokens)
    reference = backend.prefill(probe)
    backend.restore_state(payload, len(tokens))
    grafted = backend.prefill(probe)
    backend.reset()
    if np.array_equal(reference, grafted):
        return 0.0
    diff = float(np.max(np.abs(reference - grafted)))
    return diff if diff > 0 else float("nan")  # unequal but no finite gap: NaNs, never "exact"


def _held_back(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that could still grow into a stop string."""
    held = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:n]):
                held = n
                break
    return held


def _ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000.0
