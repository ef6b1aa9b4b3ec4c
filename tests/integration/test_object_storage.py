"""A library on object storage: a real S3 API (moto's server, in a subprocess on a free localhost port),
read and written through fsspec/s3fs with credentials and endpoint from the environment. Reading is shown
on the bundled Gemma library; writing on a tiny random-weight llama model, which loads in milliseconds
(storage does not depend on the model, and graft = text RAG holds on any)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from kvgraft_plugin import Entry, GraftEngine, build_library
from kvgraft_plugin.cli import main
from kvgraft_plugin.curation.build import encode_entry
from kvgraft_plugin.library.library import Library
from kvgraft_plugin.tools.doctor import MATRIX_SETTINGS
from kvgraft_plugin.tools.tiny_models import write_tiny_model
from tests.helpers import free_port

ENTRIES = [
    Entry("mul", "What is 17 times 23?", "17 times 23 is 391.", "391"),
    Entry("hex", "What is 0xff in decimal?", "0xff is 15 * 16 + 15 = 255.", "255"),
    Entry("gcd", "What is the greatest common divisor of 84 and 126?", "126 - 84 = 42, which divides 84.", "42"),
]
QUESTIONS = ["What is 17 times 23?", "What is the greatest common divisor of 84 and 126?", "What is 0xff in decimal?",
             "What is the capital of France?"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """`GraftEngine` settings of a tiny llama model."""
    model = write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", "llama")
    return {**MATRIX_SETTINGS, "n_ctx": 1024, "model_path": str(model)}


@pytest.fixture(scope="module")
def s3():
    """An S3 endpoint with one bucket; yields an s3fs filesystem. The environment points fsspec at it."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import s3fs

        deadline = time.monotonic() + 30
        while True:
            try:
                fs = s3fs.S3FileSystem(skip_instance_cache=True)
                fs.mkdir("kvgraft")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield fs
    finally:
        server.terminate()
        server.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_a_library_in_a_bucket_grafts_exactly_as_on_disk(s3, small_library, gemma_path, tmp_path):
    s3.put(str(small_library), "kvgraft/copied", recursive=True)
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as local:
        expected = [local.ask(q) for q in QUESTIONS]
    cache = tmp_path / "cache"
    with GraftEngine("s3://kvgraft/copied", model_path=str(gemma_path), n_threads=2, cache_dir=str(cache)) as remote:
        assert remote.library.location == "s3://kvgraft/copied"
        got = [remote.ask(q) for q in QUESTIONS]
        fetched = sorted(p.name for p in remote.library.path.glob("states/*.kvg"))
    assert [(r.route, r.entry_id, r.text) for r in got] == [(r.route, r.entry_id, r.text) for r in expected]
    assert [r.route for r in got] == ["graft", "graft", "graft", "plain"]
    assert len(fetched) == 3  # states are fetched on first use, not with the manifest


def test_build_verify_and_sign_at_a_url_and_a_corrupt_object_falls_back(s3, tiny, tmp_path):
    source = tmp_path / "src.jsonl"
    source.write_text("".join(json.dumps(e.to_json()) + "\n" for e in ENTRIES[:2]))
    url = "s3://kvgraft/built"
    llama = [f"--{k.replace('_', '-')}" if k != "model_path" else "--model" for k in tiny]
    cli = [x for pair in zip(llama, map(str, tiny.values())) for x in pair] + ["--cache-dir", str(tmp_path / "c1")]
    result = CliRunner().invoke(main, ["build", str(source), "--library", url, *cli], catch_exceptions=False)
    assert result.exit_code == 0 and "built 2" in result.output, result.output
    assert {p.rsplit("/", 1)[-1] for p in s3.ls("kvgraft/built")} >= {"manifest.json", "states"}
    result = CliRunner().invoke(main, ["verify", "--library", url, "--json", *cli], catch_exceptions=False)
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"], result.output
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    result = CliRunner().invoke(
        main, ["sign", "--library", url, "--key-file", str(key), "--cache-dir", str(tmp_path / "c1")]
    )
    s3.invalidate_cache()
    assert result.exit_code == 0 and s3.exists("kvgraft/built/manifest.sig"), result.output

    settings = {**tiny, "key_file": str(key)}
    with GraftEngine(url, cache_dir=str(tmp_path / "c2"), **settings) as engine:
        graft = engine.ask("What is 17 times 23?", max_tokens=8)
        text_rag = engine.ask("What is 17 times 23?", mode="text-rag", max_tokens=8)
        assert graft.route == "graft" and graft.text == text_rag.text
        record = engine.library.get("mul")
    # flip one byte of the state object in the bucket: a fresh reader falls back to text RAG, same answer
    state_key = f"kvgraft/built/{record.state_file}"
    data = bytearray(s3.cat_file(state_key))
    data[len(data) // 2] ^= 0x01
    s3.pipe_file(state_key, bytes(data))
    with GraftEngine(url, cache_dir=str(tmp_path / "c3"), **settings) as engine:
        damaged = engine.ask("What is 17 times 23?", max_tokens=8)
        assert damaged.route == "text-rag" and damaged.fallback_reason.startswith("integrity")
        assert damaged.text == graft.text
        assert not (engine.library.path / record.state_file).exists()  # the bad download is not kept


def test_a_build_killed_midway_leaves_a_consistent_library_and_resumes(s3, tiny, tmp_path, monkeypatch):
    """Every manifest the bucket ever holds names only states already uploaded; a rerun builds the rest."""
    url, entries, built = "s3://kvgraft/killed", ENTRIES, []

    def dies_on_the_third(*args, **kwargs):
        if len(built) == 2:
            raise KeyboardInterrupt  # the process is killed while building its third entry
        built.append(args[1].id)
        return encode_entry(*args, **kwargs)

    monkeypatch.setattr("kvgraft_plugin.curation.build.encode_entry", dies_on_the_third)
    engine = GraftEngine(None, **tiny)
    with pytest.raises(KeyboardInterrupt):
        build_library(url, entries, engine=engine, cache_dir=tmp_path / "c1")
    reader = Library.open(url, cache_dir=tmp_path / "reader")
    assert sorted(reader.entries) == sorted(built)
    assert all(s3.exists(f"kvgraft/killed/{r.state_file}") for r in reader.entries.values())
    monkeypatch.undo()
    report = build_library(url, entries, engine=engine, cache_dir=tmp_path / "c2")  # another machine's mirror
    engine.close()
    assert sorted(report.skipped) == sorted(built) and len(report.built) == 1
    assert sorted(Library.open(url, cache_dir=tmp_path / "reader").entries) == sorted(e.id for e in entries)
