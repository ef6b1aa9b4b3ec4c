"""LangChain classes over `GraftEngine`: `ChatKVGraft`, `KVGraftLLM` and `KVGraftRetriever`.

They follow the partner packages (langchain-ollama): pydantic fields with docstrings, the loaded engine
in a private attribute, stream-first generation that calls ``on_llm_new_token``, and async through
LangChain's executor defaults (the engine runs requests one at a time on its worker thread).

Construction: ``ChatKVGraft(library="lib/")`` with any llama.cpp or routing setting, or
``ChatKVGraft(engine=engine)`` to share an engine that is already loaded. Instances created from a
library path (`KVGraftRetriever` too) share one engine per (library, llama.cpp context settings, embedder,
key, cache folder) through a process-wide pool, so creating many instances (as langchain-tests does) loads
the model once. Only the settings an instance sets reach the engine: it adopts the library's pinned llama
settings (``n_batch``, ``type_k``...: the fingerprint) for the others, so the library's states graft. Routing
(``threshold``, ``margin``, ``neighbors``, ``guards``, ``fallback``) and generation (``max_tokens``,
``decode``, ``stop`` and every `SamplingParams` field: ``temperature``, ``top_k``, ``top_p``, ``min_p``, the
penalties, ``seed``, ``grammar``) are passed with each request, never part of that key. An engine is
closed when the last instance using it is released (`release`) or garbage-collected.

Structured output (`ChatKVGraft.with_structured_output`) constrains decoding with a grammar made from
the schema, as ChatOllama's ``format`` and llama-cpp-python's ``response_format`` do.

Chat prompts: the last message must be a human one; it is the question, and the only text the router
sees. System messages and earlier human/AI turns are rendered into the query suffix, after the grafted
entry, as ``Problem:``/``Answer:`` pairs, so the graft prefix stays exactly the library entry. Tool and
function messages, tool calls and non-text content are refused with `ConfigError`, as the partner
packages refuse what they cannot send.
"""

from __future__ import annotations

import atexit
import collections
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

try:
    from langchain_core.callbacks import CallbackManagerForLLMRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.language_models import BaseChatModel, BaseLLM, LangSmithParams
    from langchain_core.messages import (
        AIMessage,
        AIMessageChunk,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
    )
    from langchain_core.messages.ai import UsageMetadata
    from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
    from langchain_core.outputs import (
        ChatGeneration,
        ChatGenerationChunk,
        ChatResult,
        Generation,
        GenerationChunk,
        LLMResult,
    )
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
    from langchain_core.utils.function_calling import convert_to_json_schema
    from langchain_core.utils.pydantic import is_basemodel_subclass
    from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the LangChain adapter needs langchain-core: pip install 'kvgraft-plugin[langchain]'") from exc

from kvgraft_plugin.core.config import EngineConfig
from kvgraft_plugin.core.exceptions import ConfigError
from kvgraft_plugin.core.sampling import SAMPLING_FIELDS
from kvgraft_plugin.engine.engine import GraftEngine, GraftResult
from kvgraft_plugin.engine.grammar import json_grammar, json_schema_grammar
from kvgraft_plugin.engine.messages import split_chat
from kvgraft_plugin.library.store import is_url

__all__ = ["ChatKVGraft", "KVGraftLLM", "KVGraftRetriever"]

#: What pins an engine: its llama.cpp context, its embedder and its key. Everything else goes per request.
_ENGINE_SETTINGS = (
    "model_path", "n_ctx", "n_batch", "n_ubatch", "n_threads", "n_gpu_layers", "type_k", "type_v", "flash_attn",
    "swa_full", "repack", "embedder", "key_file", "cache_dir", "max_batch",
)  # fmt: skip
_ROUTING_SETTINGS = (
    "threshold",
    "margin",
    "neighbors",
    "guards",
    "fallback",
    "judge_model",
    "judge_threshold",
    "judge_mode",
    "related",
)
#: (where the library is, the engine settings a caller set, sorted). A setting left unset is not in the key:
#: the engine takes it from the library's pinned ones, so ``n_batch=512`` and no ``n_batch`` are two engines.
_PoolKey = tuple[str, tuple[tuple[str, Any], ...]]


class _EnginePool:
    """One engine per (library, engine settings) in this process, closed when its last user releases it.

    Garbage collection releases through `release_later`: a finalizer may run inside any allocation, even
    one made while this pool's lock is held on the same thread, so it only queues the key, and a short
    thread takes the lock and releases it.
    """

    def __init__(self) -> None:
        self._engines: dict[_PoolKey, tuple[GraftEngine, int]] = {}
        self._lock = threading.Lock()
        self._pending: collections.deque[_PoolKey] = collections.deque()
        # an engine still in use at exit is closed here, on the main thread, before the interpreter tears
        # down; released from a finalizer's thread instead, the process aborted (exit status 134) in 4 of 5
        atexit.register(self.close_all)

    def close_all(self) -> None:
        """Close every pooled engine, in use or not."""
        with self._lock:
            engines = [engine for engine, _ in self._engines.values()]
            self._engines.clear()
        for engine in engines:
            engine.close()

    def acquire(self, library: str | None, settings: Mapping[str, Any]) -> tuple[_PoolKey, GraftEngine]:
        """The engine for ``library`` with ``settings`` (only those the caller set, none ``None``), loaded on
        first use. They go to `GraftEngine` as keywords, not as a config, so that the engine adopts the
        library's pinned llama settings (``n_batch``, ``type_k``...) for every one the caller left unset."""
        where = "" if not library else library if is_url(library) else str(Path(library).resolve())
        key = (where, tuple(sorted(settings.items())))
        with self._lock:
            engine, users = self._engines.get(key) or (None, 0)
            if engine is None:
                engine = GraftEngine(library, **settings)
            self._engines[key] = (engine, users + 1)
            return key, engine

    def release(self, key: _PoolKey) -> None:
        with self._lock:
            engine, users = self._engines[key]
            if users > 1:
                self._engines[key] = (engine, users - 1)
                return
            del self._engines[key]
        engine.close()

    def release_later(self, key: _PoolKey) -> None:
        self._pending.append(key)
        try:
            threading.Thread(target=self._drain, name="kvgraft-release", daemon=True).start()
        except RuntimeError:  # the interpreter is exiting: the process frees everything
            pass

    def _drain(self) -> None:
        while True:
            try:
                key = self._pending.popleft()
            except IndexError:
                return
            self.release(key)

    def __len__(self) -> int:
        return len(self._engines)


_POOL = _EnginePool()


class _EngineMixin(BaseModel):
    """The settings that pin an engine, and how an instance gets one: ``engine=``, else the process's pool.

    Every setting left ``None`` is left to the engine: it adopts the library's pinned llama settings (its
    fingerprint), else its defaults. Shared by the chat model, the LLM and the retriever, so instances with
    the same settings share one engine, its trust checks and its caches."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    library: str | None = None
    """Library folder or fsspec URL (``s3://bucket/lib``) built by ``kvgraft build``. ``None`` decodes plainly."""
    cache_dir: str | None = None
    """Where a library URL is mirrored (default ``~/.cache/kvgraft/libraries``)."""
    engine: Any = Field(default=None, exclude=True)
    """A loaded `GraftEngine` to share instead of loading one from ``library``."""
    model: str | None = None
    """A model name (``kvgraft models``: ``qwen2.5-coder-1.5b-instruct``...) or a GGUF path; the same as
    ``model_path``. Default: the library's model, else Gemma 3 270M."""
    model_path: str | None = None
    """GGUF file or model name; default: the library's model, else Gemma 3 270M."""
    n_ctx: int | None = None
    """Context length (default 4096)."""
    n_batch: int | None = None
    """Prefill chunk size (default: the library's, else 512)."""
    n_ubatch: int | None = None
    """Physical micro-batch (default: the library's, else 512)."""
    n_threads: int | None = None
    """CPU threads."""
    n_gpu_layers: int | None = None
    """Layers offloaded to a GPU (default 0)."""
    type_k: str | None = None
    """K cache type (default f16)."""
    type_v: str | None = None
    """V cache type (default f16)."""
    flash_attn: bool | None = None
    """Flash attention (default off)."""
    swa_full: bool | None = None
    """Full-size sliding-window cache (default on: needed for exact grafts past ~1000 tokens)."""
    repack: bool | None = None
    """llama.cpp's repacked CPU weights (default off: batches then give one-token steps' logits)."""
    max_batch: int | None = None
    """Requests decoded together by the shared engine, each answer bitwise the one it gets alone (default 1:
    one at a time). LangChain's ``batch``/``abatch`` run their calls concurrently, so they batch with it."""
    embedder: str | None = None
    """sentence-transformers model name or path (default: the library's)."""
    key_file: str | None = None
    """HMAC key file: only a library signed with it is used."""

    _engine: GraftEngine | None = PrivateAttr(default=None)
    _release: weakref.finalize | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _validate_engine(self) -> _EngineMixin:
        if self.engine is not None and not isinstance(self.engine, GraftEngine):
            raise ConfigError(f"engine must be a GraftEngine, got {type(self.engine).__name__}")
        if self.model is not None and self.model_path is not None and self.model != self.model_path:
            raise ConfigError(f"model={self.model!r} and model_path={self.model_path!r} name two models; give one")
        return self

    def _engine_settings(self) -> dict[str, Any]:
        """The engine settings this instance sets; those it leaves ``None`` are the engine's to choose."""
        settings = {k: getattr(self, k) for k in _ENGINE_SETTINGS}
        settings["model_path"] = self.model_path or self.model
        return {k: v for k, v in settings.items() if v is not None}

    def _get_engine(self) -> GraftEngine:
        if self.engine is not None:
            return self.engine  # type: ignore[no-any-return]
        if self._engine is None:
            key, self._engine = _POOL.acquire(self.library, self._engine_settings())
            self._release = weakref.finalize(self, _POOL.release_later, key)
            self._release.atexit = False  # at exit the pool closes its engines itself (`close_all`)
        return self._engine

    def release(self) -> None:
        """Stop using the pooled engine; it is closed when no other instance uses it. A later call loads
        (or shares) one again. Does nothing for an engine passed in with ``engine=``."""
        detached = self._release.detach() if self._release is not None else None
        if detached is not None:
            _, _, (key,), _ = detached
            _POOL.release(key)
        self._engine, self._release = None, None


class _KVGraftMixin(_EngineMixin):
    """Routing and generation settings shared by the chat model and the LLM; they travel with each request."""

    mode: Literal["auto", "graft", "related", "text-rag", "plain"] = "auto"
    """Route policy (see `GraftEngine.stream`)."""
    fallback: Literal["auto", "raise"] = "auto"
    """``"raise"``: a query with no match raises `NoMatchError` (compose ``.with_fallbacks``)."""
    threshold: float | None = None
    """Cosine threshold (default: the library's calibrated one)."""
    margin: float | None = None
    """Required gap between the two best scores."""
    neighbors: int | None = None
    """Neighbours the router considers (default 4)."""
    guards: bool | None = None
    """Run the router's structural guards: a similar problem with another answer never grafts (default on)."""
    judge_model: str | None = None
    """A same-problem judge (an instruct model's name or GGUF path, or ``"off"``; default: the library's)."""
    judge_threshold: float | None = None
    """The judge's margin a match needs (default: the library's calibrated one)."""
    judge_mode: Literal["inline", "async"] | None = None
    """``async``: an unjudged candidate is not waited for; it is judged when the engine is idle and an approval
    becomes an alias of the entry (default ``async``)."""
    related: bool | None = None
    """The related route: a close question that is not the same problem is answered after its nearest entry
    as a worked example (default: as the library's calibration decided, else off)."""
    temperature: float | None = None
    """0 (default) is greedy; above 0 samples with ``seed``."""
    top_k: int | None = None
    """Sample from the k most likely tokens (default 0: off)."""
    top_p: float | None = None
    """Nucleus sampling (default 1: off)."""
    min_p: float | None = None
    """Drop tokens below ``min_p`` times the best one's probability (default 0: off)."""
    repeat_penalty: float | None = None
    """Repetition penalty over the last ``penalty_last_n`` tokens, context included (default 1: off)."""
    presence_penalty: float | None = None
    """Presence penalty (default 0: off)."""
    frequency_penalty: float | None = None
    """Frequency penalty (default 0: off)."""
    penalty_last_n: int | None = None
    """The penalties' window (default 64; -1: the whole context)."""
    seed: int | None = None
    """Sampling seed (default 0)."""
    grammar: str | None = None
    """GBNF grammar that constrains every answer (`with_structured_output` sets one per call)."""
    max_tokens: int = 64
    """Decode budget."""
    decode: Literal["auto", "step", "lookup"] | None = None
    """``lookup`` drafts answer tokens from the grafted entry and verifies them in batches, ``step`` decodes
    one token per llama.cpp call; the text is the same. Default ``auto``: lookup where proven exact."""
    stop: list[str] | None = None
    """Stop strings (default: the library format's: the newline for answers, the end marker for solutions)."""
    timeout: float | None = None
    """Accepted for LangChain compatibility; a local model has no request timeout."""
    max_retries: int = 0
    """Accepted for LangChain compatibility; local calls are not retried."""

    @model_validator(mode="after")
    def _validate_request_settings(self) -> _KVGraftMixin:
        # refuse a bad threshold or temperature now, not at the first call
        EngineConfig().with_settings(**self._routing(), **self._sampling())
        return self

    def _routing(self, **kwargs: Any) -> dict[str, Any]:
        values = {k: kwargs.get(k, getattr(self, k)) for k in _ROUTING_SETTINGS}
        return {k: v for k, v in values.items() if v is not None}

    def _sampling(self, **kwargs: Any) -> dict[str, Any]:
        values = {k: kwargs.get(k, getattr(self, k)) for k in SAMPLING_FIELDS}
        return {k: v for k, v in values.items() if v is not None}

    def _stream_result(
        self, question: str, stop: list[str] | None, **kwargs: Any
    ) -> Iterator[tuple[str, GraftResult | None]]:
        engine = self._get_engine()
        stops = stop if stop is not None else self.stop
        for chunk in engine.stream(
            question,
            mode=kwargs.get("mode", self.mode),
            entry_id=kwargs.get("entry_id"),
            max_tokens=kwargs.get("max_tokens", self.max_tokens),
            decode=kwargs.get("decode", self.decode),
            stop=tuple(stops) if stops is not None else None,
            system=kwargs.get("system"),
            history=kwargs.get("history", ()),
            routing=self._routing(**kwargs),
            **self._sampling(**kwargs),
        ):
            yield chunk.text, chunk.result

    @property
    def _identifying_params(self) -> dict[str, Any]:
        engine = self._get_engine() if self.engine is not None or self._engine is not None else None
        return {
            "library": self.library or (engine.library.location if engine and engine.library else None),
            "model_path": str(engine.model_path) if engine else self.model_path,
            "mode": self.mode,
            **self._sampling(),
            "max_tokens": self.max_tokens,
        }

    def _model_name(self) -> str:
        engine = self._get_engine()
        return Path(engine.model_path).name


def _metadata(result: GraftResult, model_name: str) -> dict[str, Any]:
    data = result.to_json()
    data.pop("text")
    data["model_name"] = model_name
    return data


def _usage(result: GraftResult) -> UsageMetadata:
    prompt = result.prefill_tokens + result.restored_tokens
    return UsageMetadata(
        input_tokens=prompt,
        output_tokens=result.decode_tokens,
        total_tokens=prompt + result.decode_tokens,
        input_token_details={"cache_read": result.restored_tokens},
    )


_ROLES = {"user": "human", "human": "human", "assistant": "ai", "ai": "ai", "system": "system"}


def _role(message: BaseMessage) -> str:
    """``human``, ``ai`` or ``system``; `ConfigError` for what ChatKVGraft cannot render."""
    role: str
    if isinstance(message, (HumanMessage, SystemMessage)):
        role = message.type
    elif isinstance(message, AIMessage):
        if message.tool_calls or message.invalid_tool_calls:
            raise ConfigError("ChatKVGraft does not support tool calls (an AI message carries some)")
        role = "ai"
    elif isinstance(message, ChatMessage) and message.role in _ROLES:
        role = _ROLES[message.role]
    else:
        kind = f"role {message.role!r}" if isinstance(message, ChatMessage) else f"type {message.type!r}"
        raise ConfigError(f"ChatKVGraft does not support messages of {kind}: only system, human and ai")
    if isinstance(message.content, list) and any(
        not isinstance(block, str) and block.get("type") != "text" for block in message.content
    ):
        raise ConfigError(f"ChatKVGraft reads text only; a {role} message has other content")
    return role


def _split_messages(messages: Sequence[BaseMessage]) -> tuple[str, str | None, list[tuple[str, str]]]:
    """(question, system text, earlier (human, ai) turns) from a chat that ends with a human message."""
    roles = {"human": "user", "ai": "assistant", "system": "system"}
    try:
        return split_chat([(roles[_role(m)], m.text) for m in messages])
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("user message", "human message")) from None


class ChatKVGraft(_KVGraftMixin, BaseChatModel):
    """Chat model over a grafted library of solved problems.

    Example:
        ```python
        from kvgraft_plugin.adapters.langchain import ChatKVGraft

        chat = ChatKVGraft(library="lib/", n_threads=2)
        message = chat.invoke("What is 17 times 23?")
        message.response_metadata["route"]  # "graft"
        ```
    """

    @property
    def _llm_type(self) -> str:
        return "kvgraft-chat"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "kvgraft"
        params["ls_model_name"] = kwargs.get("model") or self._model_name()
        return params

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        question, system, history = _split_messages(messages)
        for text, result in self._stream_result(question, stop, system=system, history=history, **kwargs):
            if result is None:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
                if run_manager:
                    run_manager.on_llm_new_token(text, chunk=chunk)
                yield chunk
            else:
                metadata = _metadata(result, self._model_name())
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content="",
                        response_metadata=metadata,
                        usage_metadata=_usage(result),
                        chunk_position="last",
                    ),
                    generation_info=metadata,
                )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        final: ChatGenerationChunk | None = None
        for chunk in self._stream(messages, stop=stop, run_manager=run_manager, **kwargs):
            final = chunk if final is None else final + chunk
        assert final is not None
        message = AIMessage(
            content=final.message.content,
            response_metadata=final.message.response_metadata,
            usage_metadata=getattr(final.message, "usage_metadata", None),
        )
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=final.generation_info)])

    def with_structured_output(  # type: ignore[override]
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, Any]:
        """A runnable that answers with an object of ``schema`` (a pydantic class, a TypedDict or a JSON
        Schema dict): a pydantic instance for a pydantic class, else a dict.

        ``method="json_schema"`` (default, as ChatOllama's) decodes under a grammar that accepts exactly the
        schema's documents; there is no tool calling, so ``"function_calling"`` does the same (what a
        forced tool call's arguments would be). ``"json_mode"`` decodes under a grammar that accepts any
        JSON object (the prompt has to ask for the keys), parsed with ``schema`` when one is given. Output
        is always strictly valid, whatever ``strict`` says. ``include_raw=True`` returns
        ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}`` instead of raising on a parse error.
        The grammar is one more sampling setting: a grafted answer still equals its text-RAG answer.
        """
        if kwargs:
            raise ConfigError(f"unsupported arguments: {sorted(kwargs)}")
        if method in ("json_schema", "function_calling"):
            if schema is None:
                raise ConfigError(f"method={method!r} needs a schema")
            grammar = json_schema_grammar(convert_to_json_schema(schema))
        elif method == "json_mode":
            grammar = json_grammar()
        else:
            raise ConfigError(f"method must be 'json_schema', 'function_calling' or 'json_mode', got {method!r}")
        llm = self.bind(grammar=grammar, ls_structured_output_format={"kwargs": {"method": method}, "schema": schema})
        pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        parser: Runnable[Any, Any] = (
            PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()  # type: ignore[arg-type]
        )
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        failed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")


class KVGraftLLM(_KVGraftMixin, BaseLLM):
    """Completion model over a grafted library: the prompt string is the question.

    Example:
        ```python
        from kvgraft_plugin.adapters.langchain import KVGraftLLM

        llm = KVGraftLLM(library="lib/")
        llm.invoke("What is 17 times 23?")  # "391"
        ```
    """

    @property
    def _llm_type(self) -> str:
        return "kvgraft"

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        for text, result in self._stream_result(prompt, stop, **kwargs):
            if result is None:
                chunk = GenerationChunk(text=text)
                if run_manager:
                    run_manager.on_llm_new_token(text, chunk=chunk)
                yield chunk
            else:
                yield GenerationChunk(text="", generation_info=_metadata(result, self._model_name()))

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        generations: list[list[Generation]] = []
        for prompt in prompts:
            final: GenerationChunk | None = None
            for chunk in self._stream(prompt, stop=stop, run_manager=run_manager, **kwargs):
                final = chunk if final is None else final + chunk
            assert final is not None
            generations.append([Generation(text=final.text, generation_info=final.generation_info)])
        return LLMResult(generations=generations)


class KVGraftRetriever(_EngineMixin, BaseRetriever):
    """The library's nearest entries as `Document`s, for text-RAG chains over the same index.

    It searches through a `GraftEngine` (``engine=``, else the same pooled engine as a `ChatKVGraft` or
    `KVGraftLLM` with the same settings), so the engine's trust checks hold: a library that fails its
    signature check (``key_file``) gives out no document. No threshold is applied: exactly ``k`` documents
    come back (fewer only if the library is smaller). Metadata: ``entry_id``, ``score`` (cosine
    similarity), ``problem``, ``answer``.
    """

    k: int = 4
    """How many entries to return."""

    @model_validator(mode="after")
    def _validate(self) -> KVGraftRetriever:
        if (self.library is None) == (self.engine is None):
            raise ConfigError("give exactly one of library= or engine=")
        if self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
        return self

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        engine = self._get_engine()
        documents = []
        for hit in engine.search(query, kwargs.get("k", self.k)):
            record = engine.library.entries.get(hit.entry_id) if engine.library is not None else None
            if record is None:  # an index read mid-prune may name an entry the manifest no longer has
                continue
            entry = record.entry
            text = f"Problem: {entry.problem}\n" + (f"Answer: {entry.answer}\n" if entry.answer else "")
            documents.append(
                Document(
                    page_content=text + f"Solution: {entry.solution}",
                    metadata={
                        "entry_id": entry.id,
                        "score": hit.score,
                        "problem": entry.problem,
                        "answer": entry.answer,
                    },
                )
            )
        return documents
