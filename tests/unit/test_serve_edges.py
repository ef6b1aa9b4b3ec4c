"""``kvgraft serve`` at its edges, over the scripted fake backend: inputs OpenAI refuses (a boolean for a
number, JSON nested too deep or not JSON at all), a wrong method or path, a crash, each answered in
OpenAI's error shape, and ``/metrics`` counting every response by status and reason; a client that leaves
(its request cancelled, before it is prefilled when it still waits) and a request that is not HTTP. The
server is a real uvicorn (with `http_protocol`) on a free localhost port, called over HTTP and raw sockets."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from kvgraft_plugin import GraftEngine
from kvgraft_plugin.serve.app import create_app, http_protocol
from tests.helpers import free_port
from tests.unit.test_engine_fake import ScriptedBackend

KEY = "edge-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ASK = {"model": "kvgraft", "messages": [{"role": "user", "content": "q"}]}


class CrashingBackend(ScriptedBackend):
    """The scripted model, except that a prompt holding ``boom`` breaks it with an error nobody expects; it
    keeps every prompt it prefilled (``prompts``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prompts: list[bytes] = []

    def prefill(self, tokens: Sequence[int]):
        prompt = bytes(t for t in tokens if t < 256)
        if len(tokens) > 1:  # one token is a decoding step
            self.prompts.append(prompt)
        if b"boom" in prompt:
            raise RuntimeError("the backend broke")
        return super().prefill(tokens)


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """``serve(script, decode=..., **create_app settings)``: the base URL of a fresh server and its backend."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the batch-invariance result
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"not a model")
    running: list[tuple[uvicorn.Server, threading.Thread, GraftEngine]] = []

    def start(
        script: str = "391", *, decode: str = "auto", http: str = "auto", **settings
    ) -> tuple[str, CrashingBackend]:
        backend = CrashingBackend(model, script.encode())
        engine = GraftEngine(None, backend=backend, n_threads=1, decode=decode)
        port = free_port()
        app = create_app(engine, **settings)
        protocol = http_protocol(app, http=http)
        config = uvicorn.Config(app, host="127.0.0.1", port=port, http=protocol, log_level="critical")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        running.append((server, thread, engine))
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}", backend

    yield start
    for server, thread, engine in running:
        server.should_exit = True
        thread.join(timeout=20)
        engine.close()


@pytest.fixture
def client(serve):
    url, _ = serve()
    with httpx.Client(base_url=url, timeout=30) as http:
        yield http


def openai_error(response: httpx.Response, status: int) -> dict:
    """The ``error`` object of an OpenAI-shaped error response with ``status``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error"), error
    return error


# -- finding 5: numbers are numbers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", True),
        ("max_completion_tokens", True),
        ("temperature", True),
        ("temperature", False),
        ("top_p", True),
        ("top_k", True),
        ("min_p", False),
        ("presence_penalty", True),
        ("frequency_penalty", True),
        ("repeat_penalty", True),
        ("seed", True),
        ("n", True),  # True == 1: it passed as the default
        ("best_of", True),
        ("top_logprobs", False),  # False == 0
        ("max_tokens", "4"),
        ("max_tokens", 4.0),
        ("seed", 3.5),
        ("temperature", "0.5"),
    ],
)
def test_a_number_field_refuses_booleans_strings_and_fractions(client, field, value):
    error = openai_error(client.post(CHAT, json={**ASK, field: value}), 400)
    assert field in error["message"]
    if field not in ("n", "best_of", "top_logprobs"):  # fields of the request model: OpenAI's param names them
        assert error["param"] == field


def test_a_boolean_budget_is_refused_on_completions_too(client):
    openai_error(client.post(COMPLETIONS, json={"model": "kvgraft", "prompt": "q", "max_tokens": True}), 400)


def test_numbers_of_either_json_type_still_work(client):
    body = {**ASK, "max_tokens": 2, "temperature": 1, "top_p": 1, "seed": 7, "n": 1, "presence_penalty": 0}
    reply = client.post(CHAT, json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "39"  # the budget of 2 was kept


# -- finding 5: bodies that are not (usable) JSON -----------------------------------------------------------


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize(
    "body",
    [
        nested(100_000),
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        '{"model": "kvgraft", "messages": [{"role": "user", "content": "q"}], "metadata": ' + nested(100_000) + "}",
        '{"model": "kvgraft", "messages": [{"role": "user", "content": "q"}], "response_format": ' + nested(900) + "}",
        '{"model": "kvgraft", "messages": ' + nested(5000, '{"role": "user", "content": "q"}') + "}",
    ],
    ids=["array-100k", "object-100k", "field-100k", "field-900", "messages-5k"],
)
def test_deeply_nested_json_is_a_400(client, body):
    openai_error(client.post(CHAT, content=body, headers={"content-type": "application/json"}), 400)
    assert client.post(CHAT, json=ASK).status_code == 200  # the server is still up


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"model": "kvgraft",', b"\xff\xfe\x00garbage", b"", b"[1, 2]", b"null", b'"text"'],
    ids=["broken", "truncated", "not-utf8", "empty", "array", "null", "string"],
)
def test_a_body_that_is_not_a_json_object_is_a_400(client, body):
    openai_error(client.post(CHAT, content=body, headers={"content-type": "application/json"}), 400)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(client, literal):
    body = '{"model": "kvgraft", "messages": [{"role": "user", "content": "q"}], "temperature": ' + literal + "}"
    openai_error(client.post(CHAT, content=body, headers={"content-type": "application/json"}), 400)


# -- finding 5: wrong methods, unknown paths, unknown models, crashes ----------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("GET", CHAT, "POST"), ("PUT", COMPLETIONS, "POST"), ("POST", "/v1/models", "GET"), ("DELETE", "/health", "GET")],
)
def test_a_wrong_method_is_a_405_in_openai_shape(client, method, path, allow):
    error = openai_error(client.request(method, path), 405)
    assert error["code"] == "method_not_allowed" and method in error["message"]
    assert allow in client.request(method, path).headers["allow"]


@pytest.mark.parametrize("path", ["/v1/nothing", "/v1/embeddings", "/", "/v1/chat/completions/extra"])
def test_an_unknown_path_is_a_404_in_openai_shape(client, path):
    error = openai_error(client.post(path, json=ASK), 404)
    assert error["code"] == "not_found" and path in error["message"]


def test_an_unknown_model_is_a_404_the_openai_client_reads(serve):
    from openai import NotFoundError, OpenAI

    url, _ = serve()
    error = openai_error(httpx.post(url + CHAT, json={**ASK, "model": "gpt-4o"}), 404)
    assert error["code"] == "model_not_found" and "gpt-4o" in error["message"]
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(NotFoundError) as caught:
        client.completions.create(model="gpt-4o", prompt="q")
    assert caught.value.code == "model_not_found"


def test_an_unexpected_error_is_a_500_in_openai_shape_and_the_server_goes_on(client):
    crash = client.post(COMPLETIONS, json={"model": "kvgraft", "prompt": "boom"})
    error = openai_error(crash, 500)
    assert error["code"] == "internal_error" and "broke" not in error["message"]  # no internals leak out
    assert crash.headers["connection"] == "close"  # uvicorn closes it: the client must not reuse it
    assert client.post(COMPLETIONS, json={"model": "kvgraft", "prompt": "q"}).json()["choices"][0]["text"] == "391"


# -- finding 4: /metrics counts every response --------------------------------------------------------------


def responses_by_status(text: str) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kvgraft_responses_total":
                counts[sample.labels["status"], sample.labels["reason"]] += int(sample.value)
    return counts


def test_metrics_count_every_response_by_status_and_reason(serve):
    url, backend = serve("x" * 2000, decode="step", api_key=KEY, max_queue=0)  # step: one token a step
    sent: Counter[tuple[str, str]] = Counter()
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as http:

        def call(status: int, reason: str, method: str, path: str, **kwargs) -> httpx.Response:
            response = http.request(method, path, **kwargs)
            assert response.status_code == status, response.text
            sent[str(status), reason] += 1
            return response

        call(200, "ok", "POST", CHAT, json={**ASK, "max_tokens": 3})
        call(200, "ok", "POST", COMPLETIONS, json={"model": "kvgraft", "prompt": "q", "max_tokens": 3})
        call(200, "ok", "GET", "/v1/models")
        call(200, "ok", "GET", "/health")
        call(400, "invalid_request_error", "POST", CHAT, json={**ASK, "max_tokens": True})  # validation (422)
        as_json = {"content-type": "application/json"}
        call(400, "invalid_request_error", "POST", CHAT, content=b"{not json", headers=as_json)
        call(400, "invalid_request_error", "POST", CHAT, content=nested(100_000), headers=as_json)
        assistant_last = {**ASK, "messages": [{"role": "assistant", "content": "a"}]}
        call(400, "invalid_request_error", "POST", CHAT, json=assistant_last)  # refused by the handler
        call(400, "context_length_exceeded", "POST", COMPLETIONS, json={"model": "kvgraft", "prompt": "x " * 3000})
        call(401, "invalid_api_key", "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        call(401, "invalid_api_key", "GET", "/metrics", headers={"Authorization": ""})
        call(404, "model_not_found", "POST", CHAT, json={**ASK, "model": "gpt-4o"})
        call(404, "not_found", "GET", "/v1/nothing")
        call(405, "method_not_allowed", "GET", CHAT)
        call(500, "internal_error", "POST", COMPLETIONS, json={"model": "kvgraft", "prompt": "boom"})
        backend.step_seconds = 0.005  # the stream below runs until the client leaves
        long = {"model": "kvgraft", "prompt": "story", "max_tokens": 2000, "stream": True, "stop": ["@@"]}
        with http.stream("POST", COMPLETIONS, json=long) as stream:
            lines = stream.iter_lines()  # kept: a dropped iterator closes the stream
            next(line for line in lines if line.startswith("data:"))  # decoding has started
            sent["200", "ok"] += 1
            busy = call(503, "queue_full", "POST", COMPLETIONS, json={"model": "kvgraft", "prompt": "q"})
            assert busy.json()["error"]["code"] == "queue_full"
        call(404, "not_found", "DELETE", "/v1/models/kvgraft")

        text = http.get("/metrics").text  # a scrape is counted in the next one
        counted = responses_by_status(text)
        assert counted == sent
        assert sum(counted.values()) == sum(sent.values()) == 18
        assert responses_by_status(http.get("/metrics").text) == sent + Counter({("200", "ok"): 1})
    # the older counters keep their names and meaning
    assert 'kvgraft_rejected_total{reason="queue_full"} 1.0' in text
    assert 'kvgraft_rejected_total{reason="unauthorized"} 2.0' in text
    assert 'kvgraft_requests_total{fallback="no-match",route="plain"}' in text


# -- finding 9: a client that leaves cancels its request, and is counted as a 499 ----------------------------


def raw_post(url: str, path: str, body: dict) -> socket.socket:
    """A connection that has sent a POST of ``body`` as JSON and read nothing: a client about to leave."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}"
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head.encode() + b"\r\n\r\n" + data)
    return sock


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.02)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples (those with ``labels``) in a ``/metrics`` text."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_request_whose_client_left_while_it_waited_is_never_prefilled(serve, stream):
    url, backend = serve("x" * 3000, decode="step")  # step: one token a step
    backend.step_seconds = 0.005  # the long request below runs until its client leaves
    long = {"model": "kvgraft", "prompt": "story", "max_tokens": 3000, "stream": True, "stop": ["@@"]}
    with httpx.Client(base_url=url, timeout=30) as http:
        with http.stream("POST", COMPLETIONS, json=long) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the stream
            next(line for line in lines if line.startswith("data:"))  # it holds the engine
            ask = {"model": "kvgraft", "max_tokens": 3, "stream": stream}
            dropped = [raw_post(url, COMPLETIONS, {**ask, "prompt": f"dropped {i}"}) for i in range(3)]
            wait_for(lambda: http.get("/health").json()["queue_depth"] == 4, "the three to wait for the engine")
            for sock in dropped:  # before any byte of an answer
                sock.close()
            cancelled = lambda: metric(http.get("/metrics").text, "kvgraft_cancelled_total")  # noqa: E731
            wait_for(lambda: cancelled() == 3, "the server to see the three leave while they wait")
        # the long one was cancelled too; the three reach the engine now, and it skips them
        wait_for(lambda: responses_by_status(http.get("/metrics").text)["499", "client_closed"] == 3, "three 499s")
        assert not [prompt for prompt in backend.prompts if b"dropped" in prompt], "a dropped request was prefilled"
        assert http.get("/health").json()["queue_depth"] == 0
        wait_for(lambda: metric(http.get("/metrics").text, "kvgraft_requests_total") == 1, "the long one's result")
        text = http.get("/metrics").text
        assert metric(text, "kvgraft_cancelled_total") == 4 and metric(text, "kvgraft_ttft_seconds_count") == 1
        assert http.post(COMPLETIONS, json={"model": "kvgraft", "prompt": "q", "max_tokens": 3}).status_code == 200


def test_a_whole_answer_stops_when_its_client_leaves_and_is_a_499(serve):
    url, backend = serve("x" * 3000, decode="step")
    backend.step_seconds = 0.005  # 3000 tokens: 15 s if nothing stops it
    sock = raw_post(url, COMPLETIONS, {"model": "kvgraft", "prompt": "story", "max_tokens": 3000, "stop": ["@@"]})
    wait_for(lambda: len(backend.calls) > 20, "decoding to start")
    sock.close()
    scrapes: list[str] = []  # each one a 200 ok, counted in the next
    with httpx.Client(base_url=url, timeout=30) as http:
        scrape = lambda: scrapes.append(http.get("/metrics").text) or scrapes[-1]  # noqa: E731
        wait_for(lambda: responses_by_status(scrape())["499", "client_closed"] == 1, "a 499, long before 15 s", 5)
    text = scrapes[-1]
    assert responses_by_status(text) == Counter({("499", "client_closed"): 1, ("200", "ok"): len(scrapes) - 1})
    assert metric(text, "kvgraft_cancelled_total") == 1 and metric(text, "kvgraft_requests_total") == 1
    assert 0 < metric(text, "kvgraft_tokens_total", kind="decoded") < 3000


# -- finding 10f: a request that is not HTTP gets OpenAI's error shape and is counted -----------------------


@pytest.mark.parametrize("parser", ["h11", "httptools"])
@pytest.mark.parametrize(
    "raw", [b"GARBAGE\r\n\r\n", b"GET /health HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n"], ids=["garbage", "header"]
)
def test_a_request_that_is_not_http_is_a_400_in_openai_shape_and_counted(serve, parser, raw):
    if parser == "httptools":
        pytest.importorskip("httptools")
    url, _ = serve(http=parser)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        reply = b""
        while piece := sock.recv(65536):  # the server closes the connection after its answer
            reply += piece
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *fields = head.decode("latin-1").split("\r\n")
    headers = [tuple(field.split(": ", 1)) for field in fields]
    response = httpx.Response(int(status.split()[1]), headers=headers, content=body)
    assert openai_error(response, 400)["code"] == "invalid_http"
    assert response.headers["connection"] == "close" and int(response.headers["content-length"]) == len(body)
    assert responses_by_status(httpx.get(url + "/metrics").text) == Counter({("400", "invalid_http"): 1})
