"""Hostile and malformed input (issue: survive tampering): each case ends in a clean message or a fallback
with a reason; nothing outside the library is touched; text that failed a check never reaches a prompt."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgraft_plugin import GraftEngine, Library
from kvgraft_plugin.cli import main

KVGRAFT = str(Path(sys.executable).parent / "kvgraft")
ENTRIES = [
    {"id": "mul-17x23", "problem": "What is 17 times 23?", "solution": "17 x 23 = 340 + 51 = 391.", "answer": "391"},
    {"id": "gcd-84-126", "problem": "What is the greatest common divisor of 84 and 126?",
     "solution": "126 = 84 + 42 and 84 = 2 x 42, so the gcd is 42.", "answer": "42"},
]  # fmt: skip


def cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "src.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in ENTRIES))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, source, gemma_path):
    lib = tmp_path_factory.mktemp("hostile") / "lib"
    result = cli("build", source, "--library", lib, "--model", gemma_path, "--n-threads", 2)
    assert result.exit_code == 0, result.output
    return lib


@pytest.fixture
def lib(built, tmp_path):
    dst = tmp_path / "lib"
    shutil.copytree(built, dst)
    return dst


def manifest(lib):
    return json.loads((lib / "manifest.json").read_text())


def write_manifest(lib, data):
    (lib / "manifest.json").write_text(json.dumps(data))


def test_a_manifest_path_outside_the_library_is_refused_and_nothing_is_deleted(lib, tmp_path, source, gemma_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    data = manifest(lib)
    data["entries"]["gcd-84-126"]["state_file"] = "../victim.txt"
    write_manifest(lib, data)
    only_mul = tmp_path / "only_mul.jsonl"
    only_mul.write_text(json.dumps(ENTRIES[0]) + "\n")
    result = cli("build", only_mul, "--library", lib, "--prune", "--model", gemma_path, "--n-threads", 2)
    assert result.exit_code == 1 and "state_file" in result.output and "Traceback" not in result.output
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize(
    "args",
    [
        ["build", "{src}", "--library", "{lib}", "--n-ctx", "64"],
        ["ask", "--library", "{lib}", "--n-ctx", "32", "What is 17 times 23?"],
    ],
)
def test_n_ctx_below_the_batch_is_a_clear_error_not_an_abort(built, source, tmp_path, args):
    argv = [a.format(src=source, lib=built if a == "{lib}" and args[0] == "ask" else tmp_path / "new") for a in args]
    proc = subprocess.run([KVGRAFT, *argv, "--n-threads", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "n_batch" in proc.stderr and "GGML_ASSERT" not in proc.stdout + proc.stderr


def test_an_interrupted_first_build_still_answers_plainly_and_verify_repairs_it(lib):
    data = manifest(lib)
    (lib / data["index"]["file"]).unlink()
    data["index"] = {}
    write_manifest(lib, data)  # as after a kill -9 before the first index was written
    plain = cli("ask", "--library", lib, "--n-threads", 2, "--mode", "plain", "--max-tokens", 2, "What is 17 times 23?")
    assert plain.exit_code == 0, plain.output
    auto = cli("ask", "--library", lib, "--n-threads", 2, "--json", "--max-tokens", 2, "What is 17 times 23?")
    assert json.loads(auto.stdout)["fallback_reason"].startswith("no-match: the library has no entries or no index")
    repaired = cli("verify", "--library", lib, "--n-threads", 2, "--repair")
    assert repaired.exit_code == 0 and "repaired (index)" in repaired.output
    after = cli("ask", "--library", lib, "--n-threads", 2, "--json", "--max-tokens", 2, "What is 17 times 23?")
    assert json.loads(after.stdout)["route"] == "graft"


def test_too_long_entries_are_skipped_with_skip_invalid_and_refused_before_writing_without(tmp_path, gemma_path):
    long = {"id": "long", "problem": "What is 2 + 2?", "solution": "2 + 2 = 4. " * 300, "answer": "4"}
    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps(ENTRIES[0]) + "\n" + json.dumps(long) + "\n")
    args = ["--model", gemma_path, "--n-threads", 2, "--n-ctx", 512]
    refused = cli("build", src, "--library", tmp_path / "a", *args)
    assert refused.exit_code == 1 and "n_ctx" in refused.output and not (tmp_path / "a").exists()
    skipped = cli("build", src, "--library", tmp_path / "b", "--skip-invalid", *args)
    assert skipped.exit_code == 0, skipped.output
    assert sorted(Library.open(tmp_path / "b").entries) == ["mul-17x23"]


def test_a_reader_of_the_previous_manifest_still_finds_its_index(lib, source, tmp_path, gemma_path):
    old_manifest = (lib / "manifest.json").read_bytes()
    extra = tmp_path / "extra.jsonl"
    extra.write_text(
        source.read_text()
        + json.dumps({"id": "add-2-2", "problem": "What is 2 plus 2?", "solution": "2 + 2 = 4.", "answer": "4"})
        + "\n"
    )
    assert cli("build", extra, "--library", lib, "--model", gemma_path, "--n-threads", 2).exit_code == 0
    (lib / "manifest.json").write_bytes(old_manifest)  # what a reader that opened it before the build holds
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2) as engine:
        assert engine.ask("What is 17 times 23?", max_tokens=2).route == "graft"


def test_unreadable_state_falls_back_to_text_rag(lib, gemma_path):
    state = lib / manifest(lib)["entries"]["mul-17x23"]["state_file"]
    state.unlink()
    state.mkdir()  # not a regular file: refused before it is opened
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2) as engine:
        result = engine.ask("What is 17 times 23?", max_tokens=6)
    assert result.route == "text-rag" and result.fallback_reason.startswith("integrity: ")
    assert "is not a regular file" in result.fallback_reason


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda t: t.write_text('{"id": "a", "problem": "What is \\ud800?", "solution": "x", "answer": "x"}\n'),
            "lone surrogate",
        ),
        (lambda t: t.write_text('{"id": "a", "problem": "\\u200b\\u200b", "solution": "x"}\n'), "visible"),
        (lambda t: t.write_text('{"id": "a", "id": "b", "problem": "p", "solution": "x"}\n'), "duplicate key"),
        (lambda t: t.write_text('{"id": "a\\n", "problem": "p", "solution": "x"}\n'), "control characters"),
    ],
)
def test_bad_sources_are_refused_cleanly_before_anything_is_written(tmp_path, make, message):
    src = tmp_path / "src.jsonl"
    make(src)
    result = cli("build", src, "--library", tmp_path / "lib", "--n-threads", 2)
    assert result.exit_code == 1 and message in result.output, result.output
    assert not (tmp_path / "lib").exists()


def test_bad_queries_files_are_refused_cleanly(built, tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"id": "\\ud800", "question": "What is 17 times 23?"}\n')
    result = cli("ask", "--library", built, "--queries", bad, "--n-threads", 2)
    assert result.exit_code == 1 and "lone surrogate" in result.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = cli("ask", "--library", built, "--queries", empty, "--n-threads", 2)
    assert result.exit_code == 1 and "no queries" in result.output


@pytest.mark.parametrize(
    ("path", "value"), [(("routing", "threshold"), "high"), (("entries", "mul-17x23", "state_bytes"), "big")]
)
def test_manifest_fields_of_the_wrong_type_are_a_clear_error(lib, path, value):
    data = manifest(lib)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    write_manifest(lib, data)
    result = cli("ask", "--library", lib, "--n-threads", 2, "What is 17 times 23?")
    assert result.exit_code == 1 and path[-1] in result.output and "Traceback" not in result.output


def test_keygen_into_a_missing_folder_is_a_clear_error(tmp_path):
    result = cli("keygen", tmp_path / "nope" / "key.bin")
    assert result.exit_code == 1 and "No such file or directory" in result.output


def test_tampered_entry_text_never_reaches_a_prompt_and_is_not_repaired(lib, gemma_path):
    data = manifest(lib)
    entry = data["entries"]["mul-17x23"]["entry"]
    entry["answer"], entry["solution"] = "999", "17 x 23 = 999."
    write_manifest(lib, data)
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2) as engine:
        fed: list[list[int]] = []
        prefill = engine.backend.prefill
        engine.backend.prefill = lambda tokens: fed.append(list(tokens)) or prefill(tokens)  # type: ignore[method-assign]
        result = engine.ask("What is 17 times 23?", max_tokens=6)
        tampered = engine.backend.tokenize("17 x 23 = 999.", add_bos=False)
    assert result.route == "plain" and result.fallback_reason.startswith("integrity")
    flat = [t for chunk in fed for t in chunk]
    assert not any(flat[i : i + len(tampered)] == tampered for i in range(len(flat)))
    result = cli("verify", "--library", lib, "--n-threads", 2, "--repair", "--json")
    rows = {r["id"]: r for r in json.loads(result.stdout)["entries"]}
    assert result.exit_code == 1 and not rows["mul-17x23"]["repaired"]
    assert "changed after it was built" in rows["mul-17x23"]["reason"]


def test_verify_catches_a_deleted_entry_and_swapped_index_ids(lib):
    data = manifest(lib)
    data["index"]["ids"] = list(reversed(data["index"]["ids"]))
    write_manifest(lib, data)
    swapped = cli("verify", "--library", lib, "--n-threads", 2)
    assert swapped.exit_code == 1 and "index row is not its entry" in swapped.output
    data["index"]["ids"] = list(reversed(data["index"]["ids"]))
    del data["entries"]["gcd-84-126"]
    write_manifest(lib, data)
    deleted = cli("verify", "--library", lib, "--n-threads", 2)
    assert deleted.exit_code == 1 and "exactly the manifest's entries" in deleted.output


@pytest.mark.parametrize(("command", "value"), [("build", "nan"), ("build", "5"), ("ask", "-0.5")])
def test_thresholds_are_validated(built, source, tmp_path, command, value):
    args = ["build", source, "--library", tmp_path / "x"] if command == "build" else ["ask", "--library", built, "hi"]
    result = cli(*args, "--threshold", value, "--n-threads", 2)
    assert result.exit_code == 1 and "threshold must be a number within [0, 1]" in result.output


def test_a_no_op_build_keeps_the_signature(lib, source, tmp_path, gemma_path):
    key = tmp_path / "key.bin"
    assert cli("keygen", key).exit_code == 0
    assert cli("sign", "--library", lib, "--key-file", key).exit_code == 0
    result = cli("build", source, "--library", lib, "--model", gemma_path, "--n-threads", 2)
    assert result.exit_code == 0 and (lib / "manifest.sig").is_file()
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2, key_file=str(key)) as engine:
        assert engine.ask("What is 17 times 23?", max_tokens=2).route == "graft"


def test_a_large_max_tokens_is_capped_to_fit_instead_of_dropping_the_graft(built, gemma_path):
    with GraftEngine(built, model_path=str(gemma_path), n_threads=2) as engine:
        result = engine.ask("What is 17 times 23?", max_tokens=100_000)
    assert result.route == "graft" and result.notes and "capped at" in result.notes[0]


# -- property: random damage never crashes, never serves failed text, and verify sees what ask would not serve

_HOSTILE_VALUES = ["../outside.txt", "/etc/passwd", -1, 1e308, "nan", None, "", [], {}, "big", True, "states/x.kvg"]


def _mutate(lib: Path, rng_choice, kind: str, pick: int, value_index: int, byte: int) -> None:
    files = sorted(p for p in lib.rglob("*") if p.is_file() and p.name != ".lock")
    if kind == "json":
        data = manifest(lib)
        record = data["entries"][sorted(data["entries"])[pick % len(data["entries"])]]
        nodes = [(record, k) for k in record] + [(record["entry"], k) for k in record["entry"]]
        nodes += [(data["index"], k) for k in data["index"]] + [(data.get("routing", {}), k) for k in ("threshold",)]
        node, key = nodes[pick % len(nodes)]
        node[key] = _HOSTILE_VALUES[value_index % len(_HOSTILE_VALUES)]
        write_manifest(lib, data)
    elif kind == "text":
        data = manifest(lib)
        entry = data["entries"][sorted(data["entries"])[pick % len(data["entries"])]]["entry"]
        entry["answer" if pick % 2 else "solution"] = "TAMPERED 999"
        write_manifest(lib, data)
    else:
        target = files[pick % len(files)]
        raw = bytearray(target.read_bytes())
        if kind == "flip" and raw:
            raw[(pick * 7919) % len(raw)] ^= byte or 1
        else:
            raw = raw[: (pick * 7919) % (len(raw) + 1)]
        target.write_bytes(bytes(raw))


@pytest.mark.slow
def test_random_damage_is_always_handled(built, gemma_path, tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from kvgraft_plugin import KVGraftError
    from kvgraft_plugin.library.library import source_sha256

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(
        kind=st.sampled_from(["json", "text", "flip", "truncate"]),
        pick=st.integers(0, 10_000),
        value_index=st.integers(0, 100),
        byte=st.integers(0, 255),
    )
    def check(kind, pick, value_index, byte):
        root = tmp_path_factory.mktemp("fuzz")
        lib = root / "lib"
        shutil.copytree(built, lib)
        outside = root / "outside.txt"
        outside.write_text("untouched")
        _mutate(lib, None, kind, pick, value_index, byte)
        served_as_built = True
        try:
            library = Library.open(lib)
            with GraftEngine(lib, model_path=str(gemma_path), n_threads=2) as engine:
                for e in ENTRIES:
                    try:
                        result = engine.ask(e["problem"], max_tokens=3)
                    except KVGraftError:
                        served_as_built = False
                        continue
                    served_as_built &= result.route == "graft" and result.entry_id == e["id"]
                    if result.route in ("graft", "text-rag"):  # no text that failed its check reached a prompt
                        record = library.get(result.entry_id)
                        assert source_sha256(record.entry) == record.source_sha256
        except KVGraftError:
            served_as_built = False
        verify = cli("verify", "--library", lib, "--n-threads", 2)
        assert "Traceback" not in verify.output and verify.exit_code in (0, 1), verify.output
        if not served_as_built:
            assert verify.exit_code == 1, (kind, pick, verify.output)
        assert outside.read_text() == "untouched"

    check()


def test_library_files_follow_the_umask(built):
    import os

    mask = os.umask(0)
    os.umask(mask)
    for path in [built / "manifest.json", *built.glob("states/*.kvg")]:
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


def test_an_unknown_entry_and_an_empty_question_fail_before_the_model_loads(built, monkeypatch):
    import kvgraft_plugin.engine.engine as engine_module

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(engine_module, "_load_backend", no_model)
    result = cli("ask", "--library", built, "--entry", "nope", "What is 17 times 23?")
    assert result.exit_code == 1 and "no entry 'nope'" in result.output
    result = cli("ask", "--library", built, "\u200b ")
    assert result.exit_code == 1 and "empty" in result.output


def test_hostile_tests_in_a_source_are_contained_and_fail_the_build(tmp_path, gemma_path):
    """A source's `tests` that fork a lingering child, write outside their folder and allocate 10 GB: with
    --run-tests each entry fails verification by name, nothing is written, nothing is left running; without
    it the build says the tests were not run."""
    marker = f"kvgraft-hostile-{tmp_path.name}"
    outside = tmp_path / "outside.txt"
    hostile = {
        "fork": f"import subprocess\nsubprocess.Popen(['sleep', '60', '{marker}'], start_new_session=True)",
        "write": f"open({str(outside)!r}, 'w').write('x')",
        "memory": "x = bytearray(10 * 1024 ** 3)",
    }
    lines = [
        {"id": name, "problem": "def f():\n    '''One.'''", "solution": "    return 1", "tests": tests}
        for name, tests in hostile.items()
    ]
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps(e) + "\n" for e in lines))
    args = ("--model", gemma_path, "--n-threads", 2)
    refused = cli("build", src, "--library", tmp_path / "lib", "--run-tests", *args)
    assert refused.exit_code == 1 and "3 entries failed verification" in refused.output, refused.output
    assert all(f"{name}: its tests fail" in refused.output for name in hostile)
    assert not outside.exists()
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1  # nothing left running
    untested = cli("build", src, "--library", tmp_path / "lib2", *args)
    assert untested.exit_code == 0 and "tests: not run for 3 entries" in untested.output, untested.output
