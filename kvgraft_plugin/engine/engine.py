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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import numpy as np

from kvgraft_plugin.core.backend import Backend, BatchBackend
from kvgraft_plugin.core.config import DecodeMode, EngineConfig, LlamaConfig, RouteMode
from kvgraft_plugin.core.exceptions import (
    ConfigError,
    EngineClosedError,
    LibraryError,
)
from kvgraft_plugin.core.models import file_sha256, model_for
from kvgraft_plugin.core.sampling import SamplingParams
from kvgraft_plugin.core.statefile import SavedState
from kvgraft_plugin.engine.batch_invariance import LookupBatch, SequenceBatch
from kvgraft_plugin.engine.decode import DecodeStats, Transcript, decode_tokens, stream_text
from kvgraft_plugin.engine.idle_judging import IdleJudging
from kvgraft_plugin.engine.planner import Planner
from kvgraft_plugin.engine.prompt_tokens import PromptTokens
from kvgraft_plugin.engine.request import Request, check_question, request_config
from kvgraft_plugin.engine.result import Capture, GraftChunk, GraftResult
from kvgraft_plugin.engine.scheduler import BatchStats, batch_scheduler
from kvgraft_plugin.engine.start import Starter
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
        self.template: Template = _template(self.config, library, self.backend)
        """How every route's tokens are laid out (`kvgraft_plugin.library.template`) and answers are shown and
        decoded (``template.fmt``): the config's, else the library's."""
        self.answer_format: AnswerFormat = self.template.fmt
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
        self._worker = Worker()
        self.idle_judging = IdleJudging(self.routing, self._worker, self._key)
        """When deferred pairs (``judge_mode="async"``) are judged: whenever the worker is idle, unless
        ``idle_judging.enabled`` is False (``kvgraft ask --queries`` judges them after the last question)."""
        try:
            self.model_sha256 = file_sha256(self.backend.model_path)
            runtime = self._worker.call(self.backend.runtime_facts)
            self.fingerprint = make_fingerprint(
                template=self.template.name, gguf_sha256=self.model_sha256, runtime=runtime, llama=self.config.llama
            )
            self._states = None if library is None else StateLoader(
                library, self.fingerprint, self.state_cache,
                prefix_tokens=self.prompts.prefix, check_payload=self.backend.check_state,
            )  # fmt: skip
            planner = Planner(library, self.routing, self._states, self.prompts, self.backend.n_ctx)
            n_threads, n_seq = self.config.llama.n_threads, getattr(self.backend, "n_seq", 1)
            self.lookup = LookupBatch(self.fingerprint, n_threads, self.run_exclusive)
            """The largest batch lookup decoding may verify (``lookup.max_batch``: measured once per build, model,
            settings and thread count, then cached; ``lookup.measure()`` measures it again now)."""
            self.sequences = SequenceBatch(self.fingerprint, n_threads, n_seq, self.run_exclusive)
            """How many sequences decode together bitwise as each alone (``sequences.measure()``: now; the
            scheduler's batch was fixed when the engine was made)."""
            self._starter = Starter(self.backend, planner, self._states, self.lookup)
            self._scheduler = batch_scheduler(
                self.backend, self._worker, self._starter.start_batched, self.template.trim, self.sequences
            )
            self._worker.call(self.prompts.preamble)
            if self.config.decode != "step" and not self.backend.layout.recurrent:
                self._worker.call(lambda: self.lookup.max_batch)  # measured once per build and model, not in a TTFT
            if library is not None and library.trusted and library.entries:
                self._worker.call(self.routing.warm_up)
                self._worker.call(lambda: self.routing.judge(self.config))  # opened (and checked) before a request
            self.routing.serving = True  # no model is opened inside a request
        except BaseException:
            self.close()  # nothing leaks when the constructor fails after loading the model
            raise

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
        """``fn(backend)`` on the worker thread, between requests, with an empty cache afterwards: for tools
        that time or probe the runtime itself (``kvgraft bench-graft``, ``kvgraft doctor``)."""
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
        return self._on_worker(self.idle_judging.judge_all)

    @property
    def aliases(self) -> Mapping[str, Alias]:
        """The library's aliases in force, by `kvgraft_plugin.library.aliases.alias_key` (empty without a library)."""
        return self.routing.aliases

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
            self.idle_judging.after_request()

    # -- the data path, on the worker thread ------------------------------------------------------------

    def _run(self, request: Request, config: EngineConfig, cancel: threading.Event) -> Iterator[GraftChunk]:
        """One request alone: route, restore or prefill, decode."""
        started = self._starter.start(request, config, lookup=True, cancel=cancel)
        stats, out, context, n_entry = DecodeStats(), Transcript(), started.context, started.n_entry
        tokens = decode_tokens(
            self.backend, started.sampler, started.limit, batch=started.lookup, entry=context[:n_entry],
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
        yield GraftChunk("", started.finish(out, stats, "lookup" if started.lookup > 1 else "step"))

    def _on_worker(self, fn: Callable[[], T]) -> T:
        self._check_open()
        return self._worker.call(fn)

    def close(self) -> None:
        """Finish queued requests, then free the llama.cpp context and model. Closing twice is harmless;
        any other call after it raises `EngineClosedError`."""
        if self._closed:
            return
        self._closed = self.idle_judging.closed = True

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


def _template(config: EngineConfig, library: Library | None, backend: Backend) -> Template:
    """How every route's tokens are laid out, in which answer format: the config's, else the library's."""
    fmt: AnswerFormat = config.answer_format or (library.answer_format if library is not None else "answer")
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
