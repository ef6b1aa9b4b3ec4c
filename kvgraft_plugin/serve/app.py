"""``kvgraft serve``: an OpenAI-compatible HTTP API over one `GraftEngine`.

Requests run on the engine's worker: up to the engine's ``max_batch`` decoded together (each answer bitwise
the one it gets alone, `kvgraft_plugin.engine.scheduler`), one at a time with 1. At most ``max_queue`` wait
behind the running ones, and the next gets a 503. A client that disconnects, streaming or not, cancels its
request: at its next token, or before it is routed or prefilled while it still waits. Every answer carries a
``kvgraft`` object (route, entry, score, fallback reason, restored tokens, TTFT) and OpenAI ``usage`` with
the restored tokens as cached prompt tokens.

Every error, the framework's own included (a body that is not JSON or nested too deep, a wrong method, an
unknown path, a crash), has OpenAI's body ``{"error": {"message", "type", "param", "code"}}``; a request
that fails validation is a 400, not FastAPI's 422. ``/metrics`` counts every response by status and reason
(see `Metrics`), a request whose client left before its answer as nginx's 499 ``client_closed``. Run under
uvicorn with `http_protocol` (as `serve` does), a request that is not valid HTTP gets OpenAI's body and is
counted too, where uvicorn would answer it in plain text.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvgraft_plugin.core.exceptions import (
    ContextOverflowError,
    EngineClosedError,
    KVGraftError,
    QueryError,
    RequestCancelledError,
)
from kvgraft_plugin.core.models import model_name_of
from kvgraft_plugin.engine.engine import GraftChunk, GraftEngine, GraftResult
from kvgraft_plugin.engine.messages import split_chat

from .schemas import ChatRequest, CompletionRequest, error_body, kvgraft_object, usage

__all__ = ["MODEL_ID", "create_app", "http_protocol"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: The model id every request may name (or the GGUF file's stem).
MODEL_ID = "kvgraft"

_FINISH = {"stop": "stop", "eog": "stop", "length": "length", "cancelled": "stop"}
#: The ``request.state`` attribute an error response leaves its reason in, for `_CountResponses`.
_REASON = "kvgraft_reason"
#: How long a stream in flight may run on after SIGTERM (sse-starlette cancels streams at once without
#: it, and then a request that had begun decoding lost its end); uvicorn waits 5 s more.
_DRAIN_SECONDS = 25
#: OpenAI error codes of the framework's own HTTP errors.
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
#: nginx's status for a request whose client closed the connection before its answer (it reaches no one).
_CLIENT_CLOSED = 499
#: How often `_beside_disconnect` asks again after a message that is not the disconnect.
_WATCH_SECONDS = 0.1


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


class Metrics:
    """The Prometheus metrics, on a registry of their own (every name starts with ``kvgraft_``).

    ``kvgraft_responses_total{status,reason}`` counts every HTTP response the app sends, whatever its path:
    ``/health`` and ``/metrics`` included (a scrape shows in the next one, not in itself), so its sum is the
    number of requests answered. ``reason`` is ``ok`` for a success, else the error body's ``code`` or,
    where it has none, its ``type`` (``invalid_request_error`` for a request that failed validation,
    ``internal_error`` for a crash). A completion whose client left before its answer was sent (before a
    stream's first byte, or before a whole answer) is a 499 ``client_closed``; under `http_protocol`, a
    request that is not valid HTTP is a 400 ``invalid_http``. ``kvgraft_requests_total`` counts the
    completions the engine ran by route (a cancelled one too, unless it never started),
    ``kvgraft_rejected_total`` the 401s and 503s, ``kvgraft_cancelled_total`` the requests whose client left.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kvgraft_requests", "Answered requests", ["route", "fallback"], registry=r)
        self.rejected = Counter("kvgraft_rejected", "Requests refused before running", ["reason"], registry=r)
        self.cancelled = Counter("kvgraft_cancelled", "Requests whose client went away before the end", registry=r)
        self.tokens = Counter("kvgraft_tokens", "Tokens by how they were obtained", ["kind"], registry=r)
        buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
        self.ttft = Histogram("kvgraft_ttft_seconds", "Time to first token", buckets=buckets, registry=r)
        self.latency = Histogram("kvgraft_request_seconds", "Time to the last token", buckets=buckets, registry=r)
        self.queue = Gauge("kvgraft_queue_depth", "Requests running or waiting for the engine", registry=r)
        self.responses = Counter(
            "kvgraft_responses", "Every HTTP response, by status and reason", ["status", "reason"], registry=r
        )

    def watch(self, engine: GraftEngine) -> None:
        """Also report ``engine``'s batched decoding (`BatchStats`): ``kvgraft_batch_size`` (a histogram of
        the sequences in each decode step) and ``kvgraft_decode_tokens_per_second`` (tokens decoded per
        second of stepping), read at every scrape."""
        self.registry.register(_BatchCollector(engine))

    def responded(self, status: int, reason: str) -> None:
        """Count one HTTP response."""
        self.responses.labels(str(status), reason).inc()

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


class _BatchCollector:
    """`Metrics.watch`'s collector: the engine's `BatchStats` as they are at a scrape."""

    BUCKETS = (1, 2, 4, 8, 16, 32, 64)

    def __init__(self, engine: GraftEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        stats = self.engine.batch_stats
        steps = dict(stats.steps) if stats is not None else {}
        buckets = [(str(bound), sum(n for size, n in steps.items() if size <= bound)) for bound in self.BUCKETS]
        histogram = HistogramMetricFamily("kvgraft_batch_size", "Sequences decoded together in each decode step")
        total = sum(steps.values())
        histogram.add_metric([], [*buckets, ("+Inf", total)], sum_value=sum(size * n for size, n in steps.items()))
        yield histogram
        speed = stats.tokens_per_second if stats is not None else 0.0
        yield GaugeMetricFamily("kvgraft_decode_tokens_per_second", "Tokens decoded per second of stepping", speed)


class _CountResponses:
    """ASGI middleware counting every HTTP response in ``kvgraft_responses_total`` (see `Metrics`).

    It sits inside Starlette's ``ServerErrorMiddleware``: an exception that reaches it before any response
    started is counted as the 500 that middleware answers it with."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})  # what ``request.state`` writes to, downstream too
        started = False

        async def counted(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                status = int(message["status"])
                self.metrics.responded(status, state.get(_REASON) or ("ok" if status < 400 else "error"))
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if not started:
                self.metrics.responded(500, "internal_error")
            raise


def _error_response(
    request: Request,
    status: int,
    message: str,
    kind: str,
    code: str | None = None,
    *,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape; its code (or else its type) is the reason `_CountResponses` counts."""
    setattr(request.state, _REASON, code or kind)
    return JSONResponse(error_body(message, kind, code, param=param), status_code=status, headers=headers)


def _validation_problem(error: Any) -> str:
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}"
    return f"{'.'.join(map(str, error['loc'][1:])) or 'body'}: {error['msg']}"


class _Slots:
    """The engine's queue as the server sees it: ``running`` requests decoding (the engine's ``max_batch``)
    and up to ``max_queue`` waiting."""

    def __init__(self, max_queue: int, metrics: Metrics, running: int = 1) -> None:
        self.max_queue, self.metrics, self.running, self.active = max_queue, metrics, running, 0

    def enter(self) -> None:
        if self.active >= self.running + self.max_queue:
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
    app.state.metrics = metrics  # for `http_protocol`
    metrics.watch(engine)
    slots = _Slots(max_queue, metrics, engine.max_batch)
    name = model_name_of(Path(engine.model_path))
    model_ids = (MODEL_ID, Path(engine.model_path).stem, *((name,) if name else ()))

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            metrics.rejected.labels("unauthorized").inc()
            raise ApiError(401, "missing or wrong API key", "invalid_request_error", "invalid_api_key")

    app.add_middleware(_CountResponses, metrics=metrics)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(request, exc.status, exc.message, exc.kind, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        problems = "; ".join(_validation_problem(e) for e in errors)
        first = errors[0] if errors else {}
        param = None if first.get("type") == "json_invalid" else ".".join(map(str, first.get("loc", ())[1:]))
        return _error_response(
            request, 400, problems or "invalid request", "invalid_request_error", param=param or None
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """The framework's own errors: an unknown path, a wrong method, a body it cannot parse."""
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = f"no such path: {where}"
        elif exc.status_code == 405:
            message = f"method not allowed: {where} (allowed: {(exc.headers or {}).get('Allow', 'none')})"
        else:  # e.g. a JSON body nested too deep to parse (a RecursionError)
            message = str(exc.detail) + (f": {exc.__cause__}" if exc.__cause__ is not None else "")
        kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        code = _HTTP_CODES.get(exc.status_code)
        return _error_response(request, exc.status_code, message, kind, code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        """Anything else: a 500 that tells nothing of the internals. Starlette then raises the error again for
        uvicorn to log, and uvicorn closes the connection: ``Connection: close`` says so to the client."""
        message = "the server had an error while processing the request"
        return _error_response(request, 500, message, "server_error", "internal_error", headers={"Connection": "close"})

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
    async def chat(request: Request, body: ChatRequest) -> Response:
        try:
            turns = [("system" if m.role == "developer" else m.role, m.text) for m in body.messages]
            question, system, history = split_chat(turns)
        except (ValueError, KVGraftError) as exc:
            raise ApiError(400, str(exc)) from exc
        return await _answer(request, body, "chat.completion", question, system=system, history=history)

    @app.post("/v1/completions", dependencies=[Depends(authorized)], response_model=None)
    async def completions(request: Request, body: CompletionRequest) -> Response:
        return await _answer(request, body, "text_completion", body.text)

    async def _answer(request: Request, body: Any, kind: str, question: str, **chat: Any) -> Response:
        if body.model not in model_ids:
            message = f"model {body.model!r} not found; this server serves {MODEL_ID!r}"
            raise ApiError(404, message, code="model_not_found")
        slots.enter()
        cancel = threading.Event()
        chunks: Iterator[GraftChunk] = engine.stream(
            question, max_tokens=body.budget, stop=body.stop, cancel=cancel, **body.sampling, **chat
        )  # a generator: nothing runs before its first `next`
        lease = _Lease(slots, metrics, chunks, cancel)
        if await request.is_disconnected():  # gone while its body was read and checked: never queued
            lease.client_left()
            lease.release()
            raise _client_closed()
        try:  # errors before any token are HTTP errors
            first = await _beside_disconnect(request, lease.client_left, lambda: next(chunks, None))
        except RequestCancelledError as exc:  # gone while it waited: the engine neither routed nor prefilled it
            lease.release()
            raise _client_closed() from exc
        except BaseException as exc:
            lease.release()
            raise _as_api_error(exc) from exc
        if lease.left:  # gone while it was prefilled: the engine stops at its next token
            lease.end(first)
            raise _client_closed()
        reply = _Reply(kind, body.model)
        if body.stream:
            events = _events(reply, first, chunks, lease, include_usage=body.include_usage)
            # the background task ends the lease too when the client leaves before the stream starts
            return EventSourceResponse(
                events, ping=15, background=BackgroundTask(lease.end), shutdown_grace_period=_DRAIN_SECONDS
            )
        try:
            result = await _beside_disconnect(request, lease.client_left, lambda: _drain(first, chunks))
        finally:
            lease.release()
        metrics.answered(result)
        if lease.left:  # the engine stopped at the token after the client left: nobody reads this answer
            raise _client_closed()
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
    """A request's place in the queue, given up exactly once, and its client's leaving.

    `release` gives the place up when the request failed or was answered whole; `end` when its stream ended
    or its client went away, even before the stream started. `client_left` (a disconnect, seen at any point)
    cancels the engine's request: it stops at its next token, or is never started if it still waits."""

    def __init__(self, slots: _Slots, metrics: Metrics, chunks: Iterator[GraftChunk], cancel: threading.Event) -> None:
        self.slots, self.metrics, self.chunks, self.cancel = slots, metrics, chunks, cancel
        self.answered = False
        """The result reached the client."""
        self.left = False
        """The client went away before its answer was sent."""
        self._released = False

    def client_left(self) -> None:
        """Cancel the engine's request: its client is gone (counted once in ``kvgraft_cancelled_total``)."""
        if self.left:
            return
        self.left = True
        self.cancel.set()
        self.metrics.cancelled.inc()
        logger.info("client went away: request cancelled")

    def release(self) -> None:
        """Leave the queue, once."""
        if not self._released:
            self._released = True
            self.slots.leave()

    def end(self, pending: GraftChunk | None = None) -> None:
        """Leave the queue; unless its result was sent, cancel the engine's request and count its result
        (the engine's chunks from ``pending``, one taken and never sent, to the last) in a thread."""
        if self._released:
            return
        self.release()
        if not self.answered:
            self.client_left()
            threading.Thread(target=self._count_the_rest, args=(pending,), daemon=True).start()

    def _count_the_rest(self, pending: GraftChunk | None) -> None:
        """The engine stops at the next token; its result still counts in the metrics."""
        for chunk in itertools.chain([pending] if pending is not None else [], self.chunks):
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


def _client_closed() -> ApiError:
    """The answer to a request whose client left: nobody reads it, but the metrics count it."""
    message = "the client closed the connection before its answer"
    return ApiError(_CLIENT_CLOSED, message, "invalid_request_error", "client_closed")


async def _beside_disconnect(request: Request, on_leave: Callable[[], None], fn: Callable[[], T]) -> T:
    """``fn()`` on a worker thread, calling ``on_leave()`` as soon as the client disconnects meanwhile.

    The watch waits on the ASGI ``receive`` (as sse-starlette's does): once the body is read, the next message
    is the disconnect, so it costs nothing while the client stays."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            await anyio.sleep(_WATCH_SECONDS)  # only where a server's ``receive`` does not wait (uvicorn's does)
        on_leave()

    outcome: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            outcome.append(await anyio.to_thread.run_sync(fn))
        except Exception as exc:  # raised below: inside the group it would come out as an ExceptionGroup
            failure.append(exc)
        finally:
            group.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return outcome[0]


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
        protocol = http_protocol(app)
        uvicorn.run(
            app, host=host, port=port, http=protocol, log_level="warning", timeout_graceful_shutdown=_DRAIN_SECONDS + 5
        )


class _InvalidHTTP:
    """`http_protocol`'s part over uvicorn's protocol class: its answer to a request it cannot parse."""

    metrics: Metrics
    transport: asyncio.Transport
    server_state: Any

    def send_400_response(self, msg: str) -> None:
        """A 400 in OpenAI's shape, counted (uvicorn has logged ``msg``); then the connection closes."""
        self.metrics.responded(400, "invalid_http")
        message = "the request is not valid HTTP/1.1"
        body = json.dumps(error_body(message, "invalid_request_error", "invalid_http")).encode()
        defaults = [name + b": " + value for name, value in self.server_state.default_headers]  # date, server
        head = [b"HTTP/1.1 400 Bad Request", *defaults]
        head += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close"]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()


def http_protocol(app: FastAPI, *, http: Literal["auto", "h11", "httptools"] = "auto") -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (its ``http=`` setting) for `create_app`'s ``app``: a request that is not valid
    HTTP gets a 400 in OpenAI's error shape (code ``invalid_http``), counted in ``app``'s metrics, where
    uvicorn answers plain text ("Invalid HTTP request received.") that nothing counts. ``http`` picks the
    parser as uvicorn does (``auto``: httptools where it is installed, else h11)."""
    if http == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:
            http = "h11"
        else:
            http = "httptools"
    base: type[asyncio.Protocol]
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    protocol = type(f"OpenAI{base.__name__}", (_InvalidHTTP, base), {"metrics": app.state.metrics})
    return cast(type[asyncio.Protocol], protocol)


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)
