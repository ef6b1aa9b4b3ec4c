"""Routing with real MiniLM embeddings, real faiss and the real Gemma model, and every fallback branch."""

from __future__ import annotations

import json
import shutil

import pytest

from kvgraft_plugin import (
    ContextOverflowError,
    GraftEngine,
    IndexMismatchError,
    Library,
    NoMatchError,
    QueryError,
)
from kvgraft_plugin.curation.build import build_library


@pytest.fixture(scope="module")
def engine(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        yield engine


@pytest.mark.parametrize(
    ("question", "entry_id"),
    [
        ("What is 17 times 23?", "mul-17x23"),  # exact repeat
        ("Compute 17 multiplied by 23.", "mul-17x23"),  # paraphrase
        ("Find the GCD of 84 and 126.", "gcd-84-126"),
        ("Solve 5x - 7 = 3x + 9 for x.", "linear-eq"),
        ("Convert the hex value 0xFF into a decimal number.", "hex-ff"),
    ],
)
def test_covered_queries_graft_onto_the_right_entry(engine, question, entry_id):
    result = engine.ask(question, max_tokens=8)
    assert (result.route, result.entry_id, result.fallback_reason) == ("graft", entry_id, None)
    assert result.score is not None and result.score >= engine.routing.threshold(engine.config)


@pytest.mark.parametrize(
    "question",
    [
        "What is the capital of France?",
        "Who painted the Mona Lisa?",
        "What is 17 times 24?",
        "What is the greatest common divisor of 84 and 128?",
    ],
)
def test_uncovered_queries_go_plain(engine, question):
    result = engine.ask(question, max_tokens=4)
    assert result.route == "plain" and result.entry_id is None and result.restored_tokens == 0
    assert result.fallback_reason.startswith("no-match")


def test_margin_refuses_ambiguous_matches(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2, margin=0.99) as strict:
        result = strict.ask("Compute 17 multiplied by 23.", max_tokens=2)
    assert result.route == "plain" and "margin" in result.fallback_reason


def test_fallback_raise(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2, fallback="raise") as strict:
        with pytest.raises(NoMatchError):
            strict.ask("What is the capital of France?")
        assert strict.ask("What is 17 times 23?").route == "graft"


def test_forced_modes(engine):
    plain = engine.ask("What is 17 times 23?", mode="plain", max_tokens=4)
    assert plain.route == "plain" and plain.fallback_reason is None and plain.entry_id is None
    rag = engine.ask("What is 17 times 23?", mode="text-rag", max_tokens=4)
    assert rag.route == "text-rag" and rag.entry_id == "mul-17x23" and rag.score is not None
    forced = engine.ask("anything at all", entry_id="hex-ff", max_tokens=2)
    assert forced.route == "graft" and forced.entry_id == "hex-ff" and forced.score is None


@pytest.mark.parametrize("bad", ["", "   ", "\ud800 lone surrogate", None])
def test_bad_queries_get_clear_errors(engine, bad):
    with pytest.raises(QueryError):
        engine.ask(bad)


def test_query_longer_than_the_context(engine):
    with pytest.raises(ContextOverflowError):
        engine.ask("nine " * 5000)


def test_entry_plus_query_too_long_goes_plain(small_library, gemma_path):
    # collatz-27 has ~2000 prefix tokens; with n_ctx 2048 it cannot fit with the query and budget
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2, n_ctx=2048) as small_ctx:
        result = small_ctx.ask(
            "Starting from 27, how many steps does the Collatz process take to reach 1?", max_tokens=64
        )
    assert result.route == "plain" and result.fallback_reason.startswith("too-long")


def _copy(src, tmp_path):
    dst = tmp_path / "lib"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip", "integrity"),
        ("truncate", "integrity"),
        ("empty", "integrity"),
        ("delete", "missing"),
        ("inexact", "inexact"),
        ("fingerprint", "incompatible"),
    ],
)
def test_unusable_state_falls_back_to_text_rag(small_library, gemma_path, tmp_path, damage, reason):
    lib = _copy(small_library, tmp_path)
    record = Library.open(lib).get("apples-train")
    path = lib / record.state_file
    if damage == "flip":
        data = bytearray(path.read_bytes())
        data[100] ^= 1
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-1000])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "delete":
        path.unlink()
    else:
        manifest = json.loads((lib / "manifest.json").read_text())
        if damage == "inexact":
            manifest["entries"]["apples-train"]["fidelity"] = "inexact"
        else:
            manifest["entries"]["apples-train"]["fingerprint_sha256"] = "0" * 64
        (lib / "manifest.json").write_text(json.dumps(manifest))
    question = "A farmer has 3 crates of 24 apples and sells 29 apples. How many apples are left?"
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2) as engine:
        result = engine.ask(question, max_tokens=6)
        assert result.route == "text-rag" and result.entry_id == "apples-train"
        assert result.fallback_reason.split(":")[0] == reason
        assert result.text == "43"  # same answer, only slower
        assert engine.ask("What is 17 times 23?", max_tokens=6).route == "graft"  # others still graft


def test_index_persists_reloads_and_grows_without_a_rebuild(small_library, gemma, example_entries, tmp_path):
    lib = _copy(small_library, tmp_path)
    before = Library.open(lib)
    new = [e for e in example_entries if e.id in ("factorial-7", "hex-ff", "mul-17x23")]
    report = build_library(lib, new, engine=gemma)
    after = Library.open(lib)
    assert report.built == ["factorial-7"] and sorted(report.skipped) == ["hex-ff", "mul-17x23"]
    assert after.index["ids"][: len(before.index["ids"])] == before.index["ids"]  # appended, not rebuilt
    assert after.index["ids"][-1] == "factorial-7"  # a rebuild would have sorted it in
    with GraftEngine(lib, model_path=str(gemma.backend.model_path), n_threads=2) as engine:
        assert engine.ask("Compute 7 factorial.", max_tokens=6).entry_id == "factorial-7"


def test_index_from_another_embedder_is_refused(small_library, gemma_path, tmp_path):
    lib = _copy(small_library, tmp_path)
    manifest = json.loads((lib / "manifest.json").read_text())
    manifest["embedder"]["files_sha256"] = "f" * 64
    (lib / "manifest.json").write_text(json.dumps(manifest))
    with GraftEngine(lib, model_path=str(gemma_path), n_threads=2) as engine:  # plain decoding still works
        assert engine.ask("What is 17 times 23?", mode="plain", max_tokens=2).route == "plain"
        with pytest.raises(IndexMismatchError, match="embedder"):
            engine.ask("What is 17 times 23?", max_tokens=2)


def test_hnsw_index_routes_like_flat(gemma, example_entries, tmp_path):
    entries = [e for e in example_entries if e.id in ("mul-17x23", "hex-ff", "linear-eq", "factorial-7")]
    build_library(tmp_path / "lib", entries, engine=gemma, index_kind="hnsw")
    assert Library.open(tmp_path / "lib").index["kind"] == "hnsw"
    with GraftEngine(tmp_path / "lib", model_path=str(gemma.backend.model_path), n_threads=2) as engine:
        assert engine.routing.index.kind == "hnsw"
        assert engine.ask("Compute 17 multiplied by 23.", max_tokens=6).entry_id == "mul-17x23"
        assert engine.ask("What is the capital of France?", max_tokens=2).route == "plain"


def test_match_check_hook_from_the_cli_refuses(small_library):
    from click.testing import CliRunner

    from kvgraft_plugin.cli import main

    args = ["ask", "--library", str(small_library), "--n-threads", "2", "--json", "--max-tokens", "2"]
    hooked = CliRunner().invoke(main, [*args, "--match-check", "tests.hooks:refuse_all", "What is 17 times 23?"])
    out = json.loads(hooked.stdout)
    assert out["route"] == "plain" and "refused by match_check" in out["fallback_reason"]
    assert out["match"][-1] == {"guard": "match_check", "entry_id": "mul-17x23", "passed": False,
                                "reason": "refused by match_check"}  # fmt: skip


def test_calibrate_stores_a_threshold_and_says_to_sign_again(small_library, tmp_path):
    from click.testing import CliRunner

    from kvgraft_plugin.cli import main

    lib = _copy(small_library, tmp_path)
    runner = CliRunner()
    assert Library.open(lib).routing["source"] == "geometry"
    key = tmp_path / "key"
    assert runner.invoke(main, ["keygen", str(key)]).exit_code == 0
    assert runner.invoke(main, ["sign", "--library", str(lib), "--key-file", str(key)]).exit_code == 0
    queries = tmp_path / "q.jsonl"
    rows = [
        {"id": "r", "question": "What is 17 times 23?", "expect_entry": "mul-17x23"},
        {"id": "p", "question": "Find the GCD of 84 and 126.", "expect_entry": "gcd-84-126"},
        {"id": "n", "question": "What is 17 plus 23?", "expect_entry": None},
        {"id": "u", "question": "What is the capital of France?", "expect_entry": None},
    ]
    queries.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(
        main, ["calibrate", "--library", str(lib), "--queries", str(queries), "--n-threads", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["right"] == 2 and out["wrong"] == 0 and out["resign"] is True
    assert "sign it again" in result.stderr and not (lib / "manifest.sig").exists()
    routing = Library.open(lib).routing
    assert routing["source"] == "calibrated" and routing["threshold"] == out["threshold"]


def test_geometry_threshold():
    import numpy as np

    from kvgraft_plugin.library.index import SINGLE_ENTRY_THRESHOLD, VectorIndex, geometry_threshold

    index = VectorIndex(2)
    index.add(["a"], np.array([[1.0, 0.0]], dtype=np.float32))
    assert geometry_threshold(index) == SINGLE_ENTRY_THRESHOLD
    index.add(["b", "c"], np.array([[0.6, 0.8], [0.8, 0.6]], dtype=np.float32))
    assert geometry_threshold(index) == pytest.approx(0.8, abs=1e-3)  # median NN similarity 0.96, capped
