"""``kvgraft serve``: an OpenAI-compatible HTTP API over one `GraftEngine`.

Requests run on the engine's worker one at a time, in arrival order; at most ``max_queue`` wait behind the
running one, and the next gets a 503. A streaming client that disconnects cancels its request at the next
token. Every answer carries a ``kvgraft`` object (route, entry, score, fallback reason, restored tokens,
TTFT) and OpenAI ``usage`` with the restored tokens as cached prompt tokens.
"""

from __future__ import annotations

import hmac
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from .._engine import GraftChunk, GraftEngine, GraftResult
from .._exceptions import ContextOverflowError, EngineClosedError, KVGraftError, QueryError
from .._messages import split_chat
from .._models import model_name_of
from .schemas import ChatRequest, CompletionRequest, error_body, kvgraft_object, usage

__all__ = ["MODEL_ID", "create_app"]

logger = logging.getLogger(__name__)

#: The model id every request may name (or the GGUF file's stem).
MODEL_ID = "kvgraft"

_FINISH = {"stop": "stop", "eog": "stop", "length": "length", "cancelled": "stop"}


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


class Metrics:
    """The Prometheus metrics, on a registry of their own (every name starts with ``kvgraft_``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kvgraft_requests", "Answered requests", ["route", "fallback"], registry=r)
        self.rejected = Counter("kvgraft_rejected", "Requests refused before running", ["reason"], registry=r)
        self.cancelled = Counter("kvgraft_cancelled", "Requests whose client went away mid-stream", registry=r)
        self.tokens = Counter("kvgraft_tokens", "Tokens by how they were obtained", ["kind"], registry=r)
        buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
        self.ttft = Histogram("kvgraft_ttft_seconds", "Time to first token", buckets=buckets, registry=r)
        self.latency = Histogram("kvgraft_request_seconds", "Time to the last token", buckets=buckets, registry=r)
        self.queue = Gauge("kvgraft_queue_depth", "Requests running or waiting for the engine", registry=r)

    def answered(self, result: GraftResult) -> None:
        reason = (result.fallback_reason or "none").split(":", 1)[0]
        self.requests.labels(result.route, reason).inc()
        self.tokens.labels("restored").inc(result.restored_tokens)
        self.tokens.labels("prefilled").inc(result.prefill_tokens)
        self.tokens.labels("decoded").inc(result.decode_tokens)
        self.tokens.labels("drafted").inc(result.drafted_tokens)
        self.tokens.labels("accepted").inc(result.accepted_tokens)
        self.ttft.observe(result.ttft_ms / 1000)
        self.latency.observe(result.total_ms / 1000)


class _Slots:
    """The engine's queue as the server sees it: one running request and up to ``max_queue`` waiting."""

    def __init__(self, max_queue: int, metrics: Metrics) -> None:
        self.max_queue, self.metrics, self.active = max_queue, metrics, 0

    def enter(self) -> None:
        if self.active > self.max_queue:
            self.metrics.rejected.labels("queue_full").inc()
            raise ApiError(503, f"the queue is full ({self.max_queue} waiting)", "server_error", "queue_full")
        self.active += 1
        self.metrics.queue.set(self.active)

    def leave(self) -> None:
        self.active -= 1
        self.metrics.queue.set(self.active)


def create_app(engine: GraftEngine, *, api_key: str | None = None, max_queue: int = 64) -> FastAPI:
    """The FastAPI app serving ``engine`` (the caller owns the engine and closes it after the server)."""
    app = FastAPI(title="kvgraft", docs_url=None, redoc_url=None)
    metrics = Metrics()
    slots = _Slots(max_queue, metrics)
    name = model_name_of(Path(engine.model_path))
    model_ids = (MODEL_ID, Path(engine.model_path).stem, *((name,) if name else ()))

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            metrics.rejected.labels("unauthorized").inc()
            raise ApiError(401, "missing or wrong API key", "invalid_request_error", "invalid_api_key")

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.kind, exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or 'body'}: {e['msg']}" for e in exc.errors())
        return JSONResponse(error_body(problems or "invalid request", "invalid_request_error"), status_code=400)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "queue_depth": slots.active}

    @app.get("/metrics", dependencies=[Depends(authorized)])
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "kvgraft"} for m in model_ids]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)], response_model=None)
    async def chat(body: ChatRequest) -> Response:
        try:
            turns = [("system" if m.role == "developer" else m.role, m.text) for m in body.messages]
            question, system, history = split_chat(turns)
        except (ValueError, KVGraftError) as exc:
            raise ApiError(400, str(exc)) from exc
        return await _answer(body, "chat.completion", question, system=system, history=history)

    @app.post("/v1/completions", dependencies=[Depends(authorized)], response_model=None)
    async def completions(body: CompletionRequest) -> Response:
        return await _answer(body, "text_completion", body.text)

    async def _answer(body: Any, kind: str, question: str, **chat: Any) -> Response:
        if body.model not in model_ids:
            message = f"model {body.model!r} not found; this server serves {MODEL_ID!r}"
            raise ApiError(404, message, code="model_not_found")
        slots.enter()
        cancel = threading.Event()
        chunks: Iterator[GraftChunk] = engine.stream(
            question, max_tokens=body.budget, stop=body.stop, cancel=cancel, **body.sampling, **chat
        )
        try:
            first = await anyio.to_thread.run_sync(next, chunks, None)  # errors before any token: an HTTP error
        except BaseException as exc:
            slots.leave()
            raise _as_api_error(exc) from exc
        reply = _Reply(kind, body.model)
        if body.stream:
            lease = _Lease(slots, metrics, chunks, cancel)
            events = _events(reply, first, chunks, lease, include_usage=body.include_usage)
            # the background task ends the lease too when the client leaves before the stream starts
            return EventSourceResponse(events, ping=15, background=BackgroundTask(lease.end))
        try:
            result = await anyio.to_thread.run_sync(_drain, first, chunks)
        finally:
            slots.leave()
        metrics.answered(result)
        return JSONResponse(reply.whole(result))

    async def _events(
        reply: _Reply, first: GraftChunk | None, chunks: Iterator[GraftChunk], lease: _Lease, *,
        include_usage: bool,
    ) -> AsyncIterator[dict[str, str]]:  # fmt: skip
        try:
            if kind_is_chat := reply.kind == "chat.completion":
                yield reply.event({"role": "assistant", "content": ""})
            chunk = first
            while chunk is not None:
                if chunk.text:
                    yield reply.event({"content": chunk.text} if kind_is_chat else chunk.text)
                if chunk.result is not None:
                    metrics.answered(chunk.result)
                    lease.answered = True
                    yield reply.event({} if kind_is_chat else "", chunk.result, include_usage=include_usage)
                    if include_usage:
                        yield reply.usage_event(chunk.result)
                chunk = await anyio.to_thread.run_sync(next, chunks, None)
            yield {"data": "[DONE]"}
        finally:
            lease.end()

    return app


class _Lease:
    """A streamed request's place in the queue, given up exactly once: when its stream ends, or when its
    client goes away (even before the stream starts), which also cancels the engine's request."""

    def __init__(self, slots: _Slots, metrics: Metrics, chunks: Iterator[GraftChunk], cancel: threading.Event) -> None:
        self.slots, self.metrics, self.chunks, self.cancel = slots, metrics, chunks, cancel
        self.answered = False
        """The result reached the client."""
        self._ended = False

    def end(self) -> None:
        """Leave the queue; cancel the engine's request unless its result was sent."""
        if self._ended:
            return
        self._ended = True
        self.slots.leave()
        if not self.answered:
            self.cancel.set()
            self.metrics.cancelled.inc()
            logger.info("client went away: request cancelled")
            threading.Thread(target=self._count_the_rest, daemon=True).start()

    def _count_the_rest(self) -> None:
        """The engine stops at the next token; its result still counts in the metrics."""
        for chunk in self.chunks:
            if chunk.result is not None:
                self.metrics.answered(chunk.result)


class _Reply:
    """Builds the response objects of one request (one id and creation time throughout)."""

    def __init__(self, kind: str, model: str) -> None:
        self.kind, self.model = kind, model
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        self.id, self.created = f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, result: GraftResult) -> dict[str, Any]:
        """The non-streamed response."""
        finish = _FINISH.get(result.finish_reason, "stop")
        if self.kind == "chat.completion":
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": result.text, "finish_reason": finish}
        choice["logprobs"] = None
        return {**self._base(self.kind), "choices": [choice], "usage": usage(result), "kvgraft": kvgraft_object(result)}

    def event(
        self, delta: dict[str, Any] | str, result: GraftResult | None = None, *, include_usage: bool = False
    ) -> dict[str, str]:
        """One streamed chunk; the one with ``result`` closes the choice and carries the ``kvgraft`` object."""
        finish = _FINISH.get(result.finish_reason, "stop") if result is not None else None
        if self.kind == "chat.completion":
            obj, choice = "chat.completion.chunk", {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            obj, choice = "text_completion", {"index": 0, "text": delta, "finish_reason": finish}
        choice["logprobs"] = None
        data: dict[str, Any] = {**self._base(obj), "choices": [choice]}
        if result is not None:
            data["kvgraft"] = kvgraft_object(result)
            if not include_usage:
                data["usage"] = usage(result)
        return {"data": json.dumps(data)}

    def usage_event(self, result: GraftResult) -> dict[str, str]:
        """``stream_options.include_usage``: a last chunk with no choices and the usage."""
        obj = "chat.completion.chunk" if self.kind == "chat.completion" else "text_completion"
        return {"data": json.dumps({**self._base(obj), "choices": [], "usage": usage(result)})}


def _drain(first: GraftChunk | None, chunks: Iterator[GraftChunk]) -> GraftResult:
    chunk = first
    while chunk is not None and chunk.result is None:
        chunk = next(chunks, None)
    if chunk is None or chunk.result is None:  # pragma: no cover - the engine always ends with a result
        raise ApiError(500, "the engine ended without a result", "server_error")
    return chunk.result


def _as_api_error(exc: BaseException) -> BaseException:
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, (QueryError, ValueError)):
        return ApiError(400, str(exc))
    if isinstance(exc, EngineClosedError):
        return ApiError(503, "the server is shutting down", "server_error", "shutting_down")
    if isinstance(exc, KVGraftError):
        return ApiError(500, str(exc), "server_error")
    return exc


def serve(
    engine_factory: Callable[[], GraftEngine], *, host: str, port: int, api_key: str | None, max_queue: int
) -> None:
    """Run the server until SIGTERM/SIGINT; requests in flight finish, then the engine closes."""
    import uvicorn

    if threading.current_thread() is threading.main_thread():
        # uvicorn drains the requests in flight, then raises the signal again: exit cleanly then
        signal.signal(signal.SIGTERM, _exit_cleanly)
    with engine_factory() as engine:
        app = create_app(engine, api_key=api_key, max_queue=max_queue)
        logger.info("serving %s on http://%s:%d", engine.model_path, host, port)
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=30)


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)
