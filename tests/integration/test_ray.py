"""Scale-out on a real local Ray instance: ``kvgraft serve --ray`` with two replicas behind Ray Serve's proxy,
and ``kvgraft build --ray`` on two workers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from click.testing import CliRunner

from kvgraft_plugin import GraftEngine
from kvgraft_plugin.cli import main
from kvgraft_plugin.library.library import Library
from kvgraft_plugin.tools.tiny_models import write_tiny_model
from tests.helpers import free_port
from tests.integration.test_object_storage import ENTRIES
from tests.integration.test_serve import KEY

QUESTIONS = ["What is 17 times 23?", "What is the capital of France?",
             "What is the greatest common divisor of 84 and 126?", "What is 0xff in decimal?"]  # fmt: skip
LOAD = 12  # requests in the bounded load test, 4 at a time


@pytest.fixture(scope="module")
def expected(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=1) as engine:
        return {q: engine.ask(q, max_tokens=16) for q in QUESTIONS}


def test_two_replicas_answer_as_one_process_and_lose_no_request(small_library, gemma_path, expected, tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY)
    port = free_port()
    args = [sys.executable, "-m", "kvgraft_plugin.cli", "serve", "--ray", "--replicas", "2", "--library",
            str(small_library), "--model", str(gemma_path), "--n-threads", "1", "--port", str(port),
            "--api-key-file", str(key_file), "--max-tokens", "16"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Ray Serve did not come up"
            time.sleep(0.5)
        from openai import OpenAI

        client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)

        def ask(question):
            reply = client.chat.completions.create(model="kvgraft", messages=[{"role": "user", "content": question}])
            return question, reply.choices[0].message.content, reply.model_extra["kvgraft"]["route"]

        for question in QUESTIONS:  # the same answers and routes as one engine in this process
            assert ask(question)[1:] == (expected[question].text, expected[question].route)
        stream = client.chat.completions.create(
            model="kvgraft", messages=[{"role": "user", "content": QUESTIONS[0]}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected[QUESTIONS[0]].text
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:  # bounded: a fixed number of requests, then it stops
            replies = list(pool.map(ask, [QUESTIONS[i % len(QUESTIONS)] for i in range(LOAD)]))
        seconds = time.perf_counter() - start
        assert len(replies) == LOAD and all(text == expected[q].text for q, text, _ in replies)
        print(f"\nRay Serve, 2 replicas: {LOAD} requests in {seconds:.2f} s ({LOAD / seconds:.2f} req/s)")
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401  # the same API, key included
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    assert code == 0


def test_build_on_ray_workers_writes_the_states_a_local_build_writes(tmp_path):
    """Two workers build bitwise the states one process builds (a tiny llama model: it loads in ms)."""
    model = write_tiny_model(tmp_path / "llama.gguf", "llama")
    source = tmp_path / "src.jsonl"
    source.write_text("".join(json.dumps(e.to_json()) + "\n" for e in ENTRIES))
    common = ["--model", str(model), "--n-threads", "1", "--n-ctx", "1024", "--n-batch", "64", "--n-ubatch", "64"]
    on_ray = CliRunner().invoke(
        main, ["build", str(source), "--library", str(tmp_path / "ray"), "--ray", "--workers", "2", *common]
    )
    assert on_ray.exit_code == 0 and "built 3" in on_ray.output, on_ray.output
    local = CliRunner().invoke(main, ["build", str(source), "--library", str(tmp_path / "local"), *common])
    assert local.exit_code == 0, local.output
    ray_lib, local_lib = Library.open(tmp_path / "ray"), Library.open(tmp_path / "local")
    assert {k: r.state_digest for k, r in ray_lib.entries.items()} == {
        k: r.state_digest for k, r in local_lib.entries.items()
    }  # bitwise the same states, so the same grafts
    verify = CliRunner().invoke(main, ["verify", "--library", str(tmp_path / "ray"), *common])
    assert verify.exit_code == 0 and "4/4 entries usable" in verify.output, verify.output  # 3 entries + index
    with GraftEngine(tmp_path / "ray", n_threads=1) as engine:
        assert engine.ask("What is 17 times 23?").route == "graft"


@pytest.fixture(autouse=True, scope="module")
def _ray_down():
    yield
    import ray

    ray.shutdown()
