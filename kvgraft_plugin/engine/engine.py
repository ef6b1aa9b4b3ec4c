"""The graft engine: the data path from a question to an answer, top to bottom.

    stream(question) -> _run:  route (`Planner`) -> restore or prefill (`_prefill`) -> decode -> `GraftResult`

Each step is one call into its layer: `Planner` (the router, the entry's checks and the fallbacks),
`StateLoader` (checked state bytes, behind the planner), the `Backend` (restore, prefill, decode) and
`kvgraft_plugin.engine.decode` (tokens to text). Every entry point (`ask`, the CLI, the tools, the LangChain
classes, the server) goes through `stream`.

Thread safety: one engine owns one llama.cpp context and one `Worker` thread. Every request runs there,
whole and in arrival order, and streams its text back, so concurrent callers get exactly the outputs they
would get serially. An abandoned stream is cancelled at its next token. Run one engine per process for
parallel throughput.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import numpy as np

from kvgraft_plugin.core.backend import Backend, BatchBackend
from kvgraft_plugin.core.config import DecodeMode, EngineConfig, LlamaConfig, RouteMode
from kvgraft_plugin.core.exceptions import (
    BackendError,
    ConfigError,
    EngineClosedError,
    LibraryError,
    RequestCancelledError,
)
from kvgraft_plugin.core.models import check_unchanged, file_identity, file_sha256, model_for
from kvgraft_plugin.core.sampling import SamplingParams
from kvgraft_plugin.core.statefile import SavedState
from kvgraft_plugin.engine.batch_invariance import InvarianceReport, LookupBatch, SequenceBatch
from kvgraft_plugin.engine.decode import DecodeStats, Transcript, decode_tokens, stream_text
from kvgraft_plugin.engine.planner import Planner
from kvgraft_plugin.engine.prompt_tokens import PromptTokens
from kvgraft_plugin.engine.request import Plan, Request, check_question, request_config
from kvgraft_plugin.engine.result import Capture, GraftChunk, GraftResult
from kvgraft_plugin.engine.scheduler import BatchStats, Scheduler, Started
from kvgraft_plugin.engine.state_loader import StateLoader, capture, restore_diff
from kvgraft_plugin.engine.worker import Worker
from kvgraft_plugin.library.aliases import Alias
from kvgraft_plugin.library.fingerprint import adopt_pinned, make_fingerprint
from kvgraft_plugin.library.index import Embedder, Hit
from kvgraft_plugin.library.library import BaseStateCache, EntryRecord, Library, RamStateCache, load_key
from kvgraft_plugin.library.template import AnswerFormat, Entry, Template, TemplateKind, make_template
from kvgraft_plugin.routing.library_routing import LibraryRouting

__all__ = ["Capture", "GraftChunk", "GraftEngine", "GraftResult", "check_question"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


class GraftEngine:
    """A frozen llama.cpp model plus a library of grafted solved problems.

    Args:
        library: library folder or fsspec URL (built by ``kvgraft build``), or ``None`` for plain decoding
            only. A URL is mirrored under ``cache_dir``; its states are fetched on first use.
        config: full configuration; keyword ``overrides`` are applied on top of it. Any
            `LlamaConfig` field (``n_ctx``, ``n_threads``, ``n_gpu_layers``, ``model_path``...) and any
            `EngineConfig` field (``threshold``, ``neighbors``, ``max_tokens``, ``key_file``...) is accepted.
            Without ``config``, the library's pinned llama settings are adopted wherever no override sets one.
        state_cache: where verified states are kept between requests (default: a RAM LRU of ``cache_bytes``).
        backend: a ready model runtime (see `Backend`) instead of loading ``model_path`` with llama.cpp;
            for tests and other runtimes. The engine closes it.
        embedder: a ready embedder instead of loading the library's (tests, or one shared by engines).

    The backend is touched by the worker thread only; the tools' methods below run there between requests.
    """

    def __init__(
        self,
        library: str | Path | Library | None = None,
        *,
        config: EngineConfig | None = None,
        state_cache: BaseStateCache | None = None,
        backend: Backend | None = None,
        embedder: Embedder | None = None,
        **overrides: Any,
    ) -> None:
        self.config = (config or EngineConfig()).with_settings(**overrides)
        self.library = library = _open_library(library, self.config)
        if library is not None and library.trusted and config is None:
            self.config = self.config.replace(llama=adopt_pinned(self.config.llama, library.fingerprint, overrides))
        if backend is None:
            model = model_for(self.config.llama.model_path, library.model if library is not None else None)
            backend = _load_backend(model, self.config.llama, self.config.max_batch)
        self.backend: Backend = backend
        """The runtime. Call it only on the worker thread: from tools, through `run_exclusive`."""
        self.answer_format: AnswerFormat = self.config.answer_format or (
            library.answer_format if library is not None else "answer"
        )
        """How answers are shown and decoded: the config's, else the library's."""
        self.template: Template = _template(self.config, library, self.answer_format, self.backend)
        """How every route's tokens are laid out (`kvgraft_plugin.library.template`): the config's, else the
        library's."""
        self.prompts = PromptTokens(self.template, self.backend.tokenize)
        instruct = bool(self.backend.meta("tokenizer.chat_template"))
        self.routing = LibraryRouting(
            library, embedder or self.config.embedder, served=self.backend.model_path if instruct else None
        )
        """The library's embedder, index and routers."""
        self.state_cache = state_cache if state_cache is not None else RamStateCache(self.config.cache_bytes)
        self._closed = False
        self._key = load_key(self.config.key_file) if self.config.key_file else None
        self.routing.key = self._key
        self._judging, self._judging_lock = False, threading.Lock()  # a deferred judgement is queued
        self.judge_when_idle = True
        """Judge deferred pairs (``judge_mode="async"``) whenever the worker is idle; False leaves them to
        `judge_deferred` (``kvgraft ask --queries`` judges them after the last question)."""
        self._worker = Worker()
        try:
            self.model_sha256 = file_sha256(self.backend.model_path)
            self._model_identity = file_identity(self.backend.model_path)
            runtime = self._worker.call(self.backend.runtime_facts)
            self.fingerprint = make_fingerprint(
                template=self.template.name, gguf_sha256=self.model_sha256, runtime=runtime, llama=self.config.llama
            )
            self._states = None if library is None else StateLoader(
                library, self.fingerprint, self.state_cache,
                prefix_tokens=self.prompts.prefix, check_payload=self.backend.check_state,
            )  # fmt: skip
            self._planner = Planner(library, self.routing, self._states, self.prompts, self.backend.n_ctx)
            self._lookup = LookupBatch(self.fingerprint, self.config.llama.n_threads, self.run_exclusive)
            n_seq = getattr(self.backend, "n_seq", 1)
            self._sequences = SequenceBatch(self.fingerprint, self.config.llama.n_threads, n_seq, self.run_exclusive)
            self._scheduler = self._batching(n_seq)
            self._worker.call(self.prompts.preamble)
            if self.config.decode != "step" and not self.backend.layout.recurrent:
                self._worker.call(lambda: self._lookup.max_batch)  # measured once per build and model, not in a TTFT
            if library is not None and library.trusted and library.entries:
                self._worker.call(self.routing.warm_up)
                self._worker.call(lambda: self.routing.judge(self.config))  # opened (and checked) before a request
        except BaseException:
            self.close()  # nothing leaks when the constructor fails after loading the model
            raise

    def _batching(self, n_seq: int) -> Scheduler | None:
        """A scheduler for up to the measured number of sequences (`SequenceBatch`), or ``None``: serial."""
        if n_seq < 2:
            return None
        proven = self._sequences.max_batch
        if proven < 2:
            logger.warning(
                "sequences decoded together are not bitwise equal to each alone on this build and model: "
                "requests are served one at a time (kvgraft doctor)"
            )
            return None
        if proven < n_seq:
            logger.warning(
                "batches of %d sequences are bitwise; of %d they are not: batching %d", proven, n_seq, proven
            )
        backend = cast(BatchBackend, self.backend)
        return Scheduler(backend, self._worker, self._start_batched, trim=self.template.trim, max_batch=proven)

    @property
    def max_batch(self) -> int:
        """Requests decoded together at most (1: one at a time)."""
        return self._scheduler.max_batch if self._scheduler is not None else 1

    @property
    def batch_stats(self) -> BatchStats | None:
        """What batched decoding did so far (``None`` when requests are served one at a time)."""
        return self._scheduler.stats if self._scheduler is not None else None

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

    # -- tools' API: each call runs on the worker thread, between requests ----------------------------

    def run_exclusive(self, fn: Callable[[Backend], T]) -> T:
        """``fn(backend)`` on the worker thread, between requests, with an empty cache afterwards.

        For measurements (``kvgraft bench-graft``, ``kvgraft doctor``) that time or probe the runtime itself.
        """

        return self._on_worker(lambda: _then_reset(self.backend, fn))

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``."""
        return self._on_worker(lambda: self.backend.tokenize(text, add_bos=add_bos))

    def prefix_tokens(self, record_or_entry: Any) -> list[int]:
        """Token ids of the graft prefix (preamble + entry) for an entry."""
        return self._on_worker(lambda: self.prompts.prefix(record_or_entry))

    def probe_tokens(self, entry: Entry) -> list[int]:
        """The query suffix that asks ``entry``'s own problem: the probe of every restore check."""
        return self._on_worker(lambda: self.prompts.probe(entry))

    def capture(
        self, tokens: Sequence[int], *, probe: Sequence[int] | None = None, restore: bytes | None = None
    ) -> Capture:
        """Prefill ``tokens`` from an empty cache and save the state; with ``probe``, check that restoring it
        (or ``restore``) is bitwise exact (`kvgraft_plugin.engine.state_loader.capture`)."""
        return self.run_exclusive(lambda backend: capture(backend, tokens, probe=probe, restore=restore))

    def restore_diff(self, tokens: Sequence[int], payload: bytearray, probe: Sequence[int]) -> float:
        """Max |logit diff| of ``probe`` after restoring ``payload`` vs after prefilling ``tokens`` afresh:
        0.0 when bitwise equal, NaN when unequal without a finite gap."""
        return self.run_exclusive(lambda backend: restore_diff(backend, tokens, payload, probe))

    def load_state(self, record: EntryRecord, *, cached: bool = True) -> SavedState:
        """``record``'s state with every check a graft makes (`StateLoader`; `StateError` if one fails), from
        the RAM cache when checked before (``cached=False``: read and check afresh, cache untouched)."""
        states = self._states
        if states is None:
            raise LibraryError("no library is loaded")
        return self._on_worker(lambda: states.load(record, cached=cached))

    def forget_state(self, record: EntryRecord) -> None:
        """Drop ``record``'s state from the RAM cache (llama.cpp refused it, or it was rebuilt)."""
        if self._states is not None:
            self._states.forget(record)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised embeddings of ``texts`` by the library's embedder."""
        return self._on_worker(lambda: self.routing.embed(list(texts)))

    def explain(self, question: str) -> list[tuple[str, float, str | None]]:
        """Every candidate the router considers for ``question``: (entry id, score, refusal or ``None``)."""
        check_question(question)
        return self._on_worker(lambda: self.routing.explain(question, self.config))

    def judge_deferred(self) -> list[Alias]:
        """Judge every pair deferred so far (``judge_mode="async"``) now, instead of when the engine is idle;
        the aliases approved (each also stored in the library)."""

        def judge_all() -> list[Alias]:
            approved = []
            while self.routing.pending:
                alias = self.routing.judge_deferred(self._key)
                approved += [alias] if alias is not None else []
            return approved

        return self._on_worker(judge_all)

    @property
    def aliases(self) -> Mapping[str, Alias]:
        """The library's aliases in force, by `kvgraft_plugin.library.aliases.alias_key` (empty without a library)."""
        return self.routing.aliases

    @property
    def lookup_batch(self) -> int:
        """The largest batch proven bitwise equal to one-token steps here (1: none is). Measured once per
        build, model, settings and thread count (`measure_invariance`), then read from the cache."""
        return self._lookup.max_batch

    def measure_batching(self) -> InvarianceReport:
        """Measure now whether this engine's sequences decoded together are bitwise equal to each alone (a few
        seconds; `kvgraft_plugin.engine.batch_invariance.measure_sequences`) and remember it for this fingerprint. The
        scheduler's batch was fixed when the engine was made."""
        return self._sequences.measure()

    def measure_invariance(self) -> InvarianceReport:
        """Measure batch invariance now (a second or two; `kvgraft_plugin.engine.batch_invariance`), remember it for
        this fingerprint and use it for lookup decoding."""
        return self._lookup.measure()

    # -- public API -----------------------------------------------------------------------------------

    def search(self, question: str, k: int | None = None) -> list[Hit]:
        """The ``k`` library entries nearest to ``question``, best first (no threshold applied).

        Nothing comes back from a library that failed its signature check: its text is not trusted."""
        check_question(question)
        return self._on_worker(lambda: self.routing.search(question, k or self.config.neighbors))

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
        cue: Literal["same", "related"] | None = None,
        **sampling_fields: Any,
    ) -> Iterator[GraftChunk]:
        """Answer ``question``, yielding text as it is decoded; the last chunk carries the result.

        ``mode``: ``auto`` routes and grafts when it can, falling back to text RAG (unusable state)
        or plain decoding (no match, too long), or, where the ``related`` route is on, answers after the
        nearest entry as a related worked example; ``graft``/``text-rag`` force a route for the matched
        (or ``entry_id``) entry, ``related`` forces the related route (``graft`` with ``cue="related"``:
        with ``mode="text-rag"`` that cue gives its text RAG twin); ``plain`` never uses the library.
        ``system`` and ``history`` (earlier question/answer turns) are rendered into the suffix; routing uses
        ``question`` alone.
        ``routing`` overrides `ROUTING_SETTINGS` (``threshold``, ``margin``, ``neighbors``, ``guards``,
        ``match_check``, ``fallback``) for this request only. Setting ``cancel`` (from any thread) stops
        decoding at the next token, as closing the iterator does; the result then ends there. Set before
        the request starts (while it waits for the worker), it is never routed or prefilled: `RequestCancelledError`.
        ``sampling`` (default: the config's) chooses the tokens; any of its fields given as a keyword
        (``temperature=0.8, seed=3, top_p=0.9, repeat_penalty=1.1, grammar=...``) overrides it. With a
        grammar and no ``stop``, decoding ends where the grammar does. ``decode`` (default: the config's)
        picks the decoder, ``step`` or ``lookup`` (``auto``: lookup where proven exact); the tokens are the same.
        """
        self._check_open()
        config = request_config(self.config, routing)
        request = Request.make(
            question, self.config, mode=mode, entry_id=entry_id, max_tokens=max_tokens, stop=stop, system=system,
            history=history, decode=decode, sampling=sampling, sampling_fields=sampling_fields,
            template_stop=self.template.stop, cue=cue,
        )  # fmt: skip
        cancel = cancel if cancel is not None else threading.Event()
        try:
            if self._scheduler is None:
                yield from self._worker.stream(lambda: self._run(request, config, cancel), cancel)
            elif self._worker.on_thread:
                raise ConfigError("a request made while another is decoding cannot join its batch: use max_batch=1")
            else:
                # an inline judge would stall every sequence decoding beside this one: it judges when idle
                batched = config.replace(judge_mode="async") if config.judge_mode == "inline" else config
                yield from self._scheduler.stream(request, batched, cancel)
        finally:
            self._judge_when_idle()

    def _judge_when_idle(self) -> None:
        """Queue the deferred judgements (``judge_mode="async"``) for when no request is waiting, one at a time."""
        with self._judging_lock:
            if self._judging or self._closed or not self.judge_when_idle or not self.routing.pending:
                return
            self._judging = True

        def judge_one() -> None:
            with self._judging_lock:
                self._judging = False
            if self._closed:
                return
            try:
                self.routing.judge_deferred(self._key)
            except Exception:  # background work: a failure is logged, never raised into a request
                logger.exception("a deferred judgement failed")
            self._judge_when_idle()

        self._worker.when_idle(judge_one)

    # -- the data path, on the worker thread ------------------------------------------------------------

    def _run(self, request: Request, config: EngineConfig, cancel: threading.Event) -> Iterator[GraftChunk]:
        """One request alone: route, restore or prefill, decode."""
        started = self._start(request, config, lookup=True, cancel=cancel)
        stats, out = DecodeStats(), Transcript()
        context, n_entry, batch = started.context, started.n_entry, started.lookup
        tokens = decode_tokens(
            self.backend, started.sampler, started.limit, batch=batch, entry=context[:n_entry],
            rest=context[n_entry:], stop=started.stop, stats=stats,
        )  # fmt: skip
        try:
            for piece in stream_text(
                tokens, self.backend, trim=self.template.trim, stop=started.stop, cancel=cancel, out=out
            ):
                yield GraftChunk(piece)
        finally:
            tokens.close()
            started.sampler.close()
        yield GraftChunk("", started.finish(out, stats, "lookup" if batch > 1 else "step"))

    def _start(
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
        plan = self._planner.plan(request, config, phases)
        if lookup:
            batch = self._lookup.for_request(
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
            self.forget_state(plan.record)
            logger.warning("restore of %s refused by llama.cpp: %s", plan.record.id, exc)
            plan = self._planner.as_text_rag(
                plan, f"integrity: llama.cpp refused the state of {plan.record.id} ({exc})"
            )
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

    def _start_batched(self, request: Request, config: EngineConfig, cancel: threading.Event) -> Started:
        return self._start(request, config, lookup=False, cancel=cancel)

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

    def _on_worker(self, fn: Callable[[], T]) -> T:
        self._check_open()
        return self._worker.call(fn)

    def close(self) -> None:
        """Finish queued requests, then free the llama.cpp context and model. Closing twice is harmless;
        any other call after it raises `EngineClosedError`."""
        if self._closed:
            return
        self._closed = True

        def free() -> None:
            self.routing.close()
            self.backend.close()

        self._worker.close(free)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this GraftEngine is closed")

    def __enter__(self) -> GraftEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_library(library: str | Path | Library | None, config: EngineConfig) -> Library | None:
    """The library to serve, opened with the config's key (a key applies however it was opened) and, for a
    URL, mirrored where and as much as the config says."""
    if library is None:
        return None
    key = load_key(config.key_file) if config.key_file else None
    if isinstance(library, Library) and key is None:
        return library
    location = library.location if isinstance(library, Library) else library
    return Library.open(location, key=key, cache_dir=config.cache_dir, cache_bytes=config.disk_cache_bytes)


def _then_reset(backend: Backend, fn: Callable[[Backend], T]) -> T:
    if getattr(backend, "n_seq", 1) > 1:
        cast(BatchBackend, backend).use_sequence(0)
    try:
        return fn(backend)
    finally:
        backend.reset()


def _template(config: EngineConfig, library: Library | None, fmt: AnswerFormat, backend: Backend) -> Template:
    """How every route's tokens are laid out: the config's template, else the library's."""
    kind: TemplateKind = config.template or (library.template if library is not None else "text")
    chat_name = config.chat_template or (library.chat_template if library is not None else None)

    def render(messages: Sequence[tuple[str, str]], add_generation_prompt: bool) -> str:
        return backend.render_chat(messages, add_generation_prompt=add_generation_prompt, name=chat_name)

    return make_template(kind, fmt, render=render, chat_name=chat_name)


def _load_backend(model_path: Path, llama: LlamaConfig, n_seq: int = 1) -> Backend:
    """llama.cpp, with a KV stream (and a recurrent state, in a recurrent or hybrid model) for each of
    ``n_seq`` sequences: imported here only, so that nothing else in the engine needs the native library."""
    from kvgraft_plugin.adapters.llama_cpp import LlamaBackend

    return LlamaBackend(model_path, llama, n_seq=n_seq)
