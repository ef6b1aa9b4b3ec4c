"""``kvgraft serve``: the real server in a subprocess on a free localhost port, called by the official
``openai`` client, LangChain's ``ChatOpenAI`` and plain HTTP (httpx)."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest

from kvgraft_plugin import GraftEngine, json_schema_grammar
from tests.helpers import KEY, start_server

QUESTION = "What is 17 times 23?"


@pytest.fixture(scope="module")
def server(small_library, gemma_path, tmp_path_factory):
    proc, url = start_server(small_library, gemma_path, tmp_path_factory.mktemp("serve"))
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0  # a graceful shutdown: uvicorn drains, the engine closes


HOT = {"temperature": 0.8, "top_p": 0.9, "seed": 3, "presence_penalty": 0.5, "frequency_penalty": 0.3}
PRODUCT = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
CONCURRENT = [QUESTION, "What is the capital of France?", "What is the greatest common divisor of 84 and 126?",
              "Name a colour."]  # fmt: skip


@pytest.fixture(scope="module")
def expected(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        chat = engine.ask(QUESTION, system="Be brief.", history=[("What is 2 plus 2?", "4")])
        sampled = engine.ask(QUESTION, **HOT, max_tokens=24, stop=[])
        structured = engine.ask(QUESTION, grammar=json_schema_grammar(PRODUCT), max_tokens=32)
        return engine.ask(QUESTION), chat, [engine.ask(q, max_tokens=16) for q in CONCURRENT], sampled, structured


def test_openai_client_chat_and_completions(server, expected):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key=KEY)
    assert {m.id for m in client.models.list()} >= {"kvgraft"}
    reply = client.chat.completions.create(model="kvgraft", messages=[{"role": "user", "content": QUESTION}])
    extra = reply.model_extra["kvgraft"]
    assert reply.choices[0].message.content == expected[0].text == "391"
    assert extra["route"] == "graft" and extra["entry_id"] == expected[0].entry_id and extra["restored_tokens"] > 0
    assert reply.usage.prompt_tokens_details.cached_tokens == expected[0].restored_tokens
    assert reply.usage.completion_tokens == expected[0].decode_tokens
    # system text and earlier turns map as in ChatKVGraft
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 plus 2?"},
                {"role": "assistant", "content": "4"}, {"role": "user", "content": QUESTION}]  # fmt: skip
    reply = client.chat.completions.create(model="kvgraft", messages=messages)
    assert reply.choices[0].message.content == expected[1].text
    assert reply.usage.prompt_tokens == expected[1].prefill_tokens + expected[1].restored_tokens
    completion = client.completions.create(model="kvgraft", prompt=QUESTION, max_tokens=8)
    assert completion.choices[0].text == "391" and completion.model_extra["kvgraft"]["route"] == "graft"


def test_streams_equal_the_whole_answer(server, expected):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key=KEY)
    chunks = list(client.chat.completions.create(model="kvgraft", messages=[{"role": "user", "content": QUESTION}],
                                                 stream=True, stream_options={"include_usage": True}))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    closing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == expected[0].text and len(closing) == 1 and closing[0].model_extra["kvgraft"]["route"] == "graft"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    pieces = list(client.completions.create(model="kvgraft", prompt=QUESTION, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == "391"


def test_uncovered_questions_do_not_graft_and_concurrent_requests_equal_serial_answers(server, expected):
    """Four clients at once, streamed and not, grafted and plain: the server decodes them together
    (``--max-batch 4`` by default) and each gets the serial engine's answer and route."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key=KEY)

    def ask(item):
        i, question = item
        if i % 2:
            pieces = list(client.completions.create(model="kvgraft", prompt=question, max_tokens=16, stream=True))
            closing = next(p for p in pieces if p.choices and p.choices[0].finish_reason)
            return "".join(p.choices[0].text for p in pieces if p.choices), closing.model_extra["kvgraft"]
        reply = client.completions.create(model="kvgraft", prompt=question, max_tokens=16)
        return reply.choices[0].text, reply.model_extra["kvgraft"]

    before = _batch_steps(server)
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(ask, enumerate(CONCURRENT)))
    assert [text for text, _ in replies] == [e.text for e in expected[2]]
    assert [extra["route"] for _, extra in replies] == [e.route for e in expected[2]]
    assert replies[1][1]["route"] == "plain"  # uncovered
    assert replies[1][1]["fallback_reason"].startswith("no-match")
    assert _batch_steps(server) > before


def _batch_steps(url: str) -> float:
    """Decode steps the server has run in batches (its ``kvgraft_batch_size`` histogram's count)."""
    return _sample(
        httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text, "kvgraft_batch_size_count"
    )


def test_a_load_of_200_requests_is_answered_or_refused_and_counted(small_library, gemma_path, tmp_path):
    """200 requests from 16 clients at once with 4 decoding and 8 waiting: each gets its answer or a 503,
    none is lost, and /metrics counts them all."""
    from concurrent.futures import ThreadPoolExecutor

    proc, url = start_server(small_library, gemma_path, tmp_path, "--max-queue", "8", "--max-batch", "4")
    headers = {"Authorization": f"Bearer {KEY}"}
    questions = [QUESTION, "Name a colour.", "What is the greatest common divisor of 84 and 126?", "Say hi."]

    def post(i):
        body = {"model": "kvgraft", "prompt": questions[i % 4], "max_tokens": 4}
        reply = httpx.post(f"{url}/v1/completions", headers=headers, json=body, timeout=120)
        return reply.status_code, reply.json()

    try:
        before = httpx.get(f"{url}/metrics", headers=headers).text  # after the start's /health polls
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(post, range(200)))
        statuses = [status for status, _ in replies]
        assert set(statuses) <= {200, 503} and statuses.count(200) > 0
        assert all(body["error"]["code"] == "queue_full" for status, body in replies if status == 503)
        texts = [body["choices"][0]["text"] for i, (status, body) in enumerate(replies) if status == 200 and i % 4 == 0]
        assert texts and set(texts) == {"391"}
        metrics = httpx.get(f"{url}/metrics", headers=headers).text
        ok = _sample(metrics, "kvgraft_responses_total", status="200", reason="ok")
        # the 200s since "before": the completions, and the /metrics response that "before" is the page of
        assert ok - _sample(before, "kvgraft_responses_total", status="200", reason="ok") == statuses.count(200) + 1
        assert _sample(metrics, "kvgraft_responses_total", status="503", reason="queue_full") == statuses.count(503)
        assert _sample(metrics, "kvgraft_rejected_total", reason="queue_full") == statuses.count(503)
        assert _sample(metrics, "kvgraft_requests_total") == statuses.count(200)  # every route
        assert _sample(metrics, "kvgraft_queue_depth") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def _sample(metrics: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels``, in a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def test_sampling_settings_and_response_format(server, expected):
    """OpenAI's sampling fields and a JSON Schema response format answer as the engine does with them."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key=KEY)
    messages = [{"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(model="kvgraft", messages=messages, max_tokens=24, stop=[], **HOT)
    assert reply.choices[0].message.content == expected[3].text and reply.model_extra["kvgraft"]["route"] == "graft"
    schema = {"type": "json_schema", "json_schema": {"name": "product", "schema": PRODUCT}}
    reply = client.chat.completions.create(model="kvgraft", messages=messages, max_tokens=32, response_format=schema)
    assert reply.choices[0].message.content == expected[4].text
    assert set(json.loads(reply.choices[0].message.content)) == {"answer"}


def test_langchain_chat_openai(server, expected):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model="kvgraft", base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    assert chat.invoke(QUESTION).content == expected[0].text
    assert "".join(c.content for c in chat.stream(QUESTION)) == expected[0].text


ASK_Q = [{"role": "user", "content": "q"}]
CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "code"),
    [
        ("post", CHAT, {"model": "kvgraft", "messages": []}, None, 400, None),
        ("post", CHAT, {"model": "kvgraft", "messages": ASK_Q, "max_tokens": 0}, None, 400, None),
        ("post", CHAT, {"model": "kvgraft", "messages": ASK_Q, "n": 2}, None, 400, None),
        ("post", CHAT, {"model": "kvgraft", "messages": ASK_Q, "top_p": 0}, None, 400, None),
        ("post", CHAT, {"model": "kvgraft", "messages": ASK_Q, "seed": -1}, None, 400, None),
        (
            "post",
            CHAT,
            {"model": "kvgraft", "messages": ASK_Q, "response_format": {"type": "json_schema"}},
            None,
            400,
            None,
        ),
        ("post", CHAT, {"model": "kvgraft", "messages": [{"role": "assistant", "content": "q"}]}, None, 400, None),
        ("post", CHAT, {"model": "gpt-4o", "messages": ASK_Q}, None, 404, "model_not_found"),
        ("post", "/v1/completions", {"model": "kvgraft", "prompt": "x " * 5000}, None, 400, "context_length_exceeded"),
        ("post", CHAT, b"{not json", None, 400, None),
        ("get", "/v1/models", None, {"Authorization": "Bearer wrong"}, 401, "invalid_api_key"),
        ("get", "/metrics", None, {}, 401, "invalid_api_key"),
    ],
)
def test_errors_have_openai_bodies(server, method, path, body, headers, status, code):
    auth = {"Authorization": f"Bearer {KEY}"} if headers is None else headers
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    response = httpx.request(method.upper(), server + path, headers=auth, timeout=60, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] and (code is None or error["code"] == code)


def test_metrics_count_routes_and_restored_tokens(server):
    httpx.post(f"{server}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
               json={"model": "kvgraft", "prompt": QUESTION}, timeout=60)  # fmt: skip
    text = httpx.get(f"{server}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert 'kvgraft_requests_total{fallback="none",route="graft"}' in text
    assert 'kvgraft_tokens_total{kind="restored"}' in text and "kvgraft_ttft_seconds_bucket" in text
    assert "kvgraft_queue_depth 0.0" in text


def test_full_queue_answers_503_and_a_disconnect_cancels(small_library, gemma_path, tmp_path):
    proc, url = start_server(small_library, gemma_path, tmp_path, "--max-queue", "0", "--max-batch", "1")
    headers = {"Authorization": f"Bearer {KEY}"}
    long = {
        "model": "kvgraft",
        "prompt": "Write a long story about a robot.",
        "max_tokens": 2000,
        "stream": True,
        "stop": ["@@@@"],
    }  # no newline stop: it runs until cancelled
    try:
        with httpx.stream("POST", f"{url}/v1/completions", headers=headers, json=long, timeout=60) as stream:
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data:"))  # decoding has started
            busy = httpx.post(f"{url}/v1/completions", headers=headers, json={"model": "kvgraft", "prompt": "q"})
            assert busy.status_code == 503 and busy.json()["error"]["code"] == "queue_full"
        # the client went away: the request stops at the next token, far short of its 2000
        deadline = time.monotonic() + 60
        while 'kvgraft_tokens_total{kind="decoded"}' not in (text := httpx.get(f"{url}/metrics", headers=headers).text):
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
        assert "kvgraft_cancelled_total 1.0" in text
        decoded = float(text.split('kvgraft_tokens_total{kind="decoded"} ')[1].split()[0])
        assert 0 < decoded < 2000
        ok = httpx.post(f"{url}/v1/completions", headers=headers, json={"model": "kvgraft", "prompt": QUESTION})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "391"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_sigterm_lets_a_request_in_flight_finish(small_library, gemma_path, tmp_path):
    proc, url = start_server(small_library, gemma_path, tmp_path)
    body = {"model": "kvgraft", "prompt": "Count from one to twenty:", "max_tokens": 60, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, json=body,
                      timeout=60) as stream:  # fmt: skip
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # in flight
        proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][5:])["kvgraft"]["route"] in ("graft", "plain")
    assert proc.wait(timeout=60) == 0
