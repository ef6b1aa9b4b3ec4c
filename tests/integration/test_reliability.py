"""Reliability of the graft store: the fault suite, signatures, verify, crash-safe builds, concurrency.

Every fault case must end in a fallback with a reason or a clear KVGraftError: no crash, no wrong graft.
Cases that hand crafted bytes to native code run in a subprocess, and the test checks its exit status.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgraft_plugin import GraftEngine, Library, LibraryError
from kvgraft_plugin.cli import main

QUESTION = "A farmer has 3 crates of 24 apples and sells 29 apples. How many apples are left?"
ENTRY = "apples-train"


def _copy(src, tmp_path, name="lib"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _manifest(lib):
    return json.loads((lib / "manifest.json").read_text())


def _write_manifest(lib, data):
    (lib / "manifest.json").write_text(json.dumps(data))


def _rehash(lib, entry_id):
    """An attacker without the key: recompute every hash the manifest holds for a modified state."""
    data = _manifest(lib)
    record = data["entries"][entry_id]
    raw = bytearray((lib / record["state_file"]).read_bytes())
    raw[-32:] = hashlib.blake2b(bytes(raw[:-32]), digest_size=32).digest()
    (lib / record["state_file"]).write_bytes(bytes(raw))
    record["state_digest"] = bytes(raw[-32:]).hex()
    record["state_sha256"] = hashlib.sha256(raw).hexdigest()
    _write_manifest(lib, data)


# -- faults that end in a fallback --------------------------------------------------------------------


def _flip_kv(lib):
    path = lib / _manifest(lib)["entries"][ENTRY]["state_file"]
    raw = bytearray(path.read_bytes())
    raw[-5000] ^= 0x04
    path.write_bytes(bytes(raw))


def _flip_header(lib):
    path = lib / _manifest(lib)["entries"][ENTRY]["state_file"]
    raw = bytearray(path.read_bytes())
    raw[40] ^= 0x01
    path.write_bytes(bytes(raw))


def _flip_header_token_rehashed(lib):
    """A changed token id in the header, with every hash recomputed: the manifest's ids disagree."""
    path = lib / _manifest(lib)["entries"][ENTRY]["state_file"]
    raw = bytearray(path.read_bytes())
    start = raw.index(b'"tokens":[') + len(b'"tokens":[')
    raw[start] = ord("3") if raw[start] != ord("3") else ord("4")
    path.write_bytes(bytes(raw))
    _rehash(lib, ENTRY)


def _bad_cell_count_rehashed(lib):
    """Crafted llama.cpp bytes (cell count inflated) with valid hashes: the structural walk refuses it."""
    data = _manifest(lib)
    path = lib / data["entries"][ENTRY]["state_file"]
    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[12:16], "little")
    cells_at = 16 + header_len + 8 + 4  # seq header, n_stream, then cell_count
    raw[cells_at : cells_at + 4] = (10**6).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    _rehash(lib, ENTRY)


def _truncate(lib):
    path = lib / _manifest(lib)["entries"][ENTRY]["state_file"]
    path.write_bytes(path.read_bytes()[:-4096])


def _empty(lib):
    (lib / _manifest(lib)["entries"][ENTRY]["state_file"]).write_bytes(b"")


def _missing(lib):
    (lib / _manifest(lib)["entries"][ENTRY]["state_file"]).unlink()


def _other_entry_file(lib):
    data = _manifest(lib)
    shutil.copy(lib / data["entries"]["hex-ff"]["state_file"], lib / data["entries"][ENTRY]["state_file"])


def _flip_manifest_digest(lib):
    """One character of the manifest's digest for the entry: still valid JSON, no longer the file's."""
    data = _manifest(lib)
    digest = data["entries"][ENTRY]["state_digest"]
    data["entries"][ENTRY]["state_digest"] = ("1" if digest[0] != "1" else "2") + digest[1:]
    _write_manifest(lib, data)


def _flip_manifest_tokens(lib):
    """A prefix token id changed in the manifest: the state's header no longer matches it."""
    data = _manifest(lib)
    data["entries"][ENTRY]["tokens"][3] += 1
    _write_manifest(lib, data)


def _fingerprint_field(field, value):
    def damage(lib):
        data = _manifest(lib)
        data["fingerprint"][field] = value
        data["entries"][ENTRY]["fingerprint_sha256"] = "0" * 64
        _write_manifest(lib, data)

    return damage


FALLBACK_FAULTS = {
    "flip-kv-bytes": (_flip_kv, "integrity"),
    "flip-header": (_flip_header, "integrity"),
    "header-token-rehashed": (_flip_header_token_rehashed, "integrity"),
    "crafted-cells-rehashed": (_bad_cell_count_rehashed, "integrity"),
    "truncated": (_truncate, "integrity"),
    "empty-file": (_empty, "integrity"),
    "missing-file": (_missing, "missing"),
    "flip-manifest-digest": (_flip_manifest_digest, "integrity"),
    "flip-manifest-tokens": (_flip_manifest_tokens, "integrity"),
    "another-entry's-file": (_other_entry_file, "integrity"),
    "other-type_v": (_fingerprint_field("type_v", "q8_0"), "incompatible"),
    "other-flash_attn": (_fingerprint_field("flash_attn", True), "incompatible"),
    "other-template": (_fingerprint_field("template", "solved-v0"), "incompatible"),
}

_CHILD = """
import json, sys
from kvgraft_plugin import GraftEngine
with GraftEngine(sys.argv[1], model_path=sys.argv[2], n_threads=2) as engine:
    r = engine.ask(sys.argv[3], mode="graft", entry_id=sys.argv[4], max_tokens=6)
    print(json.dumps({"route": r.route, "reason": r.fallback_reason, "text": r.text}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FALLBACK_FAULTS))
def test_fault_ends_in_a_fallback_with_a_reason(small_library, gemma_path, tmp_path, fault):
    damage, reason = FALLBACK_FAULTS[fault]
    lib = _copy(small_library, tmp_path)
    damage(lib)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(lib), str(gemma_path), QUESTION, ENTRY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, f"crashed with {child.returncode}: {child.stderr[-2000:]}"
    out = json.loads(child.stdout.strip().splitlines()[-1])
    assert out["route"] == "text-rag" and out["reason"].split(":")[0] == reason
    assert out["text"] == "43"  # the entry's answer, from its text: no wrong graft


def test_state_from_another_model_is_a_fallback(small_library, smol_path, tmp_path):
    with GraftEngine(_copy(small_library, tmp_path), model_path=str(smol_path), n_threads=2) as engine:
        result = engine.ask(QUESTION, mode="graft", entry_id=ENTRY, max_tokens=4)
    assert result.route == "text-rag" and result.fallback_reason.startswith("incompatible")


# -- signed libraries --------------------------------------------------------------------------------


@pytest.fixture
def signed(small_library, tmp_path):
    lib = _copy(small_library, tmp_path)
    key = tmp_path / "key"
    runner = CliRunner()
    assert runner.invoke(main, ["keygen", str(key)]).exit_code == 0
    assert len(key.read_bytes()) == 32 and (key.stat().st_mode & 0o777) == 0o600
    assert runner.invoke(main, ["keygen", str(key)]).exit_code == 1  # never overwrites a key
    assert runner.invoke(main, ["sign", "--library", str(lib), "--key-file", str(key)]).exit_code == 0
    return lib, key


def test_signed_library_grafts_with_its_key(signed, gemma_path):
    lib, key = signed
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2, key_file=str(key)) as engine:
        assert engine.ask("What is 17 times 23?", max_tokens=6).route == "graft"


@pytest.mark.parametrize("tamper", ["text", "rehashed-state", "unsigned", "wrong-key"])
def test_tampering_is_caught_by_the_signature(signed, gemma_path, tmp_path, tamper):
    lib, key = signed
    if tamper == "text":
        data = _manifest(lib)
        data["entries"]["mul-17x23"]["entry"]["answer"] = "999"
        _write_manifest(lib, data)
    elif tamper == "rehashed-state":
        _flip_kv(lib)
        _rehash(lib, ENTRY)
    elif tamper == "unsigned":
        (lib / "manifest.sig").unlink()
    else:
        key = tmp_path / "other-key"
        key.write_bytes(os.urandom(32))
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2, key_file=str(key)) as engine:
        for question in ("What is 17 times 23?", QUESTION):
            result = engine.ask(question, max_tokens=6)
            assert result.route == "plain" and result.entry_id is None
            assert result.fallback_reason.startswith("unsigned")
        forced = engine.ask("What is 17 times 23?", mode="text-rag", entry_id="mul-17x23", max_tokens=6)
        assert forced.route == "plain" and forced.fallback_reason.startswith("unsigned")
        assert "999" not in forced.text
    result = CliRunner().invoke(main, ["verify", "--library", str(lib), "--key-file", str(key), "--json"])
    assert result.exit_code == 1 and "unsigned" in result.output


def test_key_from_the_environment(signed, tmp_path):
    lib, _ = signed
    other = tmp_path / "env-key"
    other.write_bytes(os.urandom(32))
    result = CliRunner().invoke(main, ["verify", "--library", str(lib)], env={"KVGRAFT_KEY_FILE": str(other)})
    assert result.exit_code == 1 and "unsigned" in result.output


# -- verify -------------------------------------------------------------------------------------------


def test_verify_reports_and_repairs(small_library, tmp_path):
    lib = _copy(small_library, tmp_path)
    runner = CliRunner()
    ok = runner.invoke(main, ["verify", "--library", str(lib), "--n-threads", "2", "--fidelity", "--json"])
    assert ok.exit_code == 0, ok.output
    assert all(row["ok"] for row in json.loads(ok.stdout)["entries"])
    _flip_kv(lib)
    bad = runner.invoke(main, ["verify", "--library", str(lib), "--n-threads", "2", "--json"])
    rows = {r["id"]: r for r in json.loads(bad.stdout)["entries"]}
    assert bad.exit_code == 1 and rows[ENTRY]["reason"].startswith("integrity")
    assert sum(not r["ok"] for r in rows.values()) == 1
    fixed = runner.invoke(main, ["verify", "--library", str(lib), "--n-threads", "2", "--repair"])
    assert fixed.exit_code == 0 and "repaired" in fixed.output
    again = runner.invoke(main, ["verify", "--library", str(lib), "--n-threads", "2", "--fidelity"])
    assert again.exit_code == 0, again.output


# -- index faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_broken_index_fails_clearly_and_build_rebuilds_it(small_library, gemma, tmp_path, damage):
    from kvgraft_plugin.curation.build import build_library

    lib = _copy(small_library, tmp_path)
    index_file = lib / _manifest(lib)["index"]["file"]
    if damage == "missing":
        index_file.unlink()
    else:
        index_file.write_bytes(b"not an index")
    with GraftEngine(lib, model_path=str(gemma.backend.model_path), n_threads=2) as broken:
        assert broken.ask("What is 17 times 23?", mode="plain", max_tokens=2).route == "plain"
        with pytest.raises(LibraryError, match="index"):
            broken.ask("What is 17 times 23?", max_tokens=2)
    entries = [r.entry for r in Library.open(lib).entries.values()]
    report = build_library(lib, entries, engine=gemma)
    assert report.built == [] and len(Library.open(lib).index["ids"]) == len(entries)
    with GraftEngine(lib, model_path=str(gemma.backend.model_path), n_threads=2) as engine:
        assert engine.ask("What is 17 times 23?", max_tokens=6).route == "graft"


# -- crash-safe builds -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_during_build_leaves_a_usable_library(example_entries, gemma_path, tmp_path):
    chosen = [e for e in example_entries if len(e.solution) < 400][:10]
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps(e.to_json()) + "\n" for e in chosen))
    lib = tmp_path / "lib"
    cmd = [
        str(Path(sys.executable).parent / "kvgraft"),
        "build",
        str(src),
        "--library",
        str(lib),
        "--model",
        str(gemma_path),
        "--n-threads",
        "2",
    ]
    killed_with = []
    for delay in (4.0, 5.5, 7.0):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed_with.append(delay)
        proc.wait()
        if (lib / "manifest.json").exists():
            library = Library.open(lib)  # always parseable: the manifest is replaced atomically
            for record in library.entries.values():
                state = (lib / record.state_file).read_bytes()
                assert hashlib.sha256(state).hexdigest() == record.state_sha256
    assert killed_with, "the build finished before any kill; raise the entry count"
    resumed = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    library = Library.open(lib)
    assert sorted(library.entries) == sorted(e.id for e in chosen)
    assert sorted(library.index["ids"]) == sorted(e.id for e in chosen)
    assert not list(lib.glob("**/.*.tmp"))
    verify = CliRunner().invoke(main, ["verify", "--library", str(lib), "--n-threads", "2"])
    assert verify.exit_code == 0, verify.output


def test_a_second_concurrent_build_is_refused(small_library, gemma, example_entries, tmp_path):
    from kvgraft_plugin.curation.build import build_library

    lib = _copy(small_library, tmp_path)
    with Library.open(lib).lock():
        with pytest.raises(LibraryError, match="another build"):
            build_library(lib, example_entries[:1], engine=gemma)


# -- concurrency -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_threads_through_engine_and_adapter_equal_serial(small_library, gemma_path):
    from kvgraft_plugin.adapters.langchain import ChatKVGraft

    questions = [
        "What is 17 times 23?",
        "Find the GCD of 84 and 126.",
        "What is the capital of France?",
        "Solve 5x - 7 = 3x + 9 for x.",
    ]
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        serial = [engine.ask(q, max_tokens=12).text for q in questions]
        chat = ChatKVGraft(engine=engine, max_tokens=12)
        results: dict[tuple[int, int], str] = {}

        def worker(t: int) -> None:
            for i, q in enumerate(questions):
                if (t + i) % 2:
                    results[t, i] = engine.ask(q, max_tokens=12).text
                else:
                    results[t, i] = chat.invoke(q).content

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "deadlock"
    assert all(results[t, i] == serial[i] for t in range(4) for i in range(len(questions)))


def test_abandoned_stream_is_cancelled_at_its_next_token(small_library, gemma_path):
    question = "Write a long story about a cat."
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        whole = engine.ask(question, mode="plain", max_tokens=40, stop=())
        assert whole.decode_tokens == 40  # uncancelled, this request decodes that many tokens
        steps: list[int] = []
        prefill = engine.backend.prefill
        engine.backend.prefill = lambda tokens: steps.append(len(tokens)) or prefill(tokens)  # type: ignore[method-assign]
        stream = engine.stream(question, mode="plain", max_tokens=40, stop=())
        next(stream)
        decoded_when_abandoned = len(steps)
        stream.close()  # abandoned mid-decode (what garbage collection does to a dropped generator)
        assert engine.ask("What is 17 times 23?", max_tokens=6).text == "391"
        engine.backend.prefill = prefill  # type: ignore[method-assign]
    after = [n for n in steps[decoded_when_abandoned:]]
    abandoned_steps = next(i for i, n in enumerate(after) if n > 1)  # one-token steps until the next request
    assert abandoned_steps <= 3, f"the abandoned stream kept decoding for {abandoned_steps} tokens"
