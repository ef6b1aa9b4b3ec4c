"""`kvgraft bench` and `kvgraft curate` on the real model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvgraft_plugin import SamplingParams
from kvgraft_plugin.cli import main
from kvgraft_plugin.curation.build import build_library
from kvgraft_plugin.curation.curate import curate
from kvgraft_plugin.library.library import read_source
from kvgraft_plugin.tools.bench import run_bench

ROW_KEYS = {
    "id",
    "mode",
    "route",
    "entry_id",
    "score",
    "fallback_reason",
    "text",
    "answer_extracted",
    "correct",
    "prefill_tokens",
    "restored_tokens",
    "decode_tokens",
    "ttft_ms",
    "total_ms",
}
QUERIES = [
    {"id": "q1", "question": "What is 17 times 23?", "answer": "391", "expect_entry": "mul-17x23"},
    {"id": "q2", "question": "Find the GCD of 84 and 126.", "answer": "42", "expect_entry": "gcd-84-126"},
    {"id": "q3", "question": "What is 17 times 24?", "answer": "408", "expect_entry": None},
    {"id": "q4", "question": "What is the capital of France?", "expect_entry": None},
    {
        "id": "q5",
        "question": "Starting from 27, how many steps does the Collatz process take to reach 1?",
        "answer": "111",
    },
]


@pytest.fixture(scope="module")
def bench_out(small_library, gemma_path, tmp_path_factory):
    from kvgraft_plugin import GraftEngine

    out = tmp_path_factory.mktemp("bench")
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        summary = run_bench(engine, QUERIES, out, max_tokens=16)
    return out, summary


def test_bench_writes_every_artifact(bench_out):
    out, summary = bench_out
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == len(QUERIES) * 3 and all(set(r) >= ROW_KEYS for r in rows)
    assert set(summary["modes"]) == {"plain", "text-rag", "graft"}
    for mode in summary["modes"].values():
        assert {
            "n",
            "correct",
            "accuracy",
            "ttft_ms_median",
            "ttft_ms_mean",
            "total_ms_median",
            "prefill_tokens",
            "restored_tokens",
            "decode_tokens",
        } <= set(mode)
    assert {"identical_rate", "n_grafted", "retrieval", "plots", "machine", "config"} <= set(summary)
    assert json.loads((out / "summary.json").read_text())["n_grafted"] == summary["n_grafted"]
    assert "| graft |" in (out / "summary.md").read_text()
    assert summary["plots"] and all((out / p).stat().st_size > 1000 for p in summary["plots"])


def test_bench_counts_wrong_grafts_and_false_copies(small_library, gemma_path, tmp_path):
    """Without guards the near-miss grafts onto the 17 x 23 entry and copies its answer: both are counted."""
    from kvgraft_plugin import GraftEngine

    near_miss = {"id": "nm", "question": "What is 17 plus 23?", "answer": "40", "expect_entry": None,
                 "near_miss_of": "mul-17x23", "kind": "near-miss/operation"}  # fmt: skip
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2, guards=False) as engine:
        loose = run_bench(engine, [near_miss], tmp_path / "loose", modes=["graft"], max_tokens=8)
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        guarded = run_bench(engine, [near_miss], tmp_path / "guarded", modes=["graft"], max_tokens=8)
    assert loose["modes"]["graft"]["by_kind"]["near-miss/operation"]["grafted"] == 1
    assert loose["retrieval"] == {"labelled": 1, "hits": 0, "wrong_grafts": 1, "false_copies": 1}
    assert guarded["retrieval"] == {"labelled": 1, "hits": 1, "wrong_grafts": 0, "false_copies": 0}
    assert "| near-miss/operation | 1 |" in (tmp_path / "guarded" / "summary.md").read_text()


def test_bench_identity_retrieval_and_tokens(bench_out):
    out, summary = bench_out
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert summary["n_grafted"] == 3 and summary["identical_rate"] == 1.0
    assert summary["retrieval"] == {"labelled": 4, "hits": 4, "wrong_grafts": 0, "false_copies": 0}
    graft = {r["id"]: r for r in rows if r["mode"] == "graft"}
    plain = {r["id"]: r for r in rows if r["mode"] == "plain"}
    assert graft["q1"]["correct"] is True and plain["q1"]["correct"] is False
    assert graft["q4"]["correct"] is None  # no answer and no checker
    assert graft["q3"]["route"] == "plain" and graft["q3"]["fallback_reason"].startswith("no-match")
    assert summary["modes"]["graft"]["accuracy"] > summary["modes"]["plain"]["accuracy"]
    tokens = summary["decode_tokens_on_covered"]
    assert tokens["graft_decode"] < tokens["plain_decode"] and tokens["plain_max_tokens"] == 16


def always_true(question, text):
    return True


def test_bench_cli_with_a_custom_checker(small_library, tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps(q) + "\n" for q in QUERIES[:2]))
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--library",
            str(small_library),
            "--queries",
            str(queries),
            "--modes",
            "plain,graft",
            "--out",
            str(tmp_path / "out"),
            "--max-tokens",
            "8",
            "--n-threads",
            "2",
            "--checker",
            "tests.integration.test_bench_curate:always_true",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["modes"]["plain"]["correct"] == 2 and set(summary["modes"]) == {"plain", "graft"}


def test_curate_keeps_only_verified_solutions_and_builds(gemma, tmp_path):
    problems = [
        {"id": "avg", "problem": "The scores are 72, 85, 90 and 93. What is their average?", "answer": "85"},
        {"id": "hard", "problem": "What is 987654 times 123457?", "answer": "121932222678"},
    ]
    out = tmp_path / "curated.jsonl"
    from kvgraft_plugin.curation.answer_checks import default_check

    reports = curate(gemma, problems, out, attempts=2, sampling=SamplingParams(), checker=default_check)
    by_id = {r.id: r for r in reports}
    assert by_id["avg"].kept and by_id["avg"].successes >= 1 and by_id["avg"].attempts == 1
    assert not by_id["hard"].kept and by_id["hard"].attempts == 2 and by_id["hard"].decode_tokens > 0
    entries = read_source(out)
    assert [e.id for e in entries] == ["avg"] and entries[0].answer == "85"
    report = build_library(tmp_path / "lib", entries, engine=gemma)
    assert report.built == ["avg"] and not report.invalid
