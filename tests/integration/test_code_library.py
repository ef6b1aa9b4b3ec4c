"""The code example library: solutions verified by their tests at build, grafted in the ``solution`` format,
and benched with ``--checker tests`` (the expected entry's tests, under the name the query asks for)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvgraft_plugin.cli import main

CODE = Path(__file__).resolve().parents[2] / "examples" / "code"
TASKS = ("code/rle", "code/balanced", "code/roman", "code/triangular")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_code_library_builds_verified_and_grafts_passing_code(tmp_path, gemma_path):
    lines = (CODE / "library.jsonl").read_text(encoding="utf-8").splitlines()
    src = tmp_path / "code.jsonl"
    src.write_text("\n".join(line for line in lines if json.loads(line)["id"] in TASKS) + "\n", encoding="utf-8")
    built = run("build", src, "--library", tmp_path / "lib", "--model", gemma_path, "--n-threads", 2, "--run-tests")
    assert built.exit_code == 0 and "built 4" in built.output, built.output
    assert "(solution format, text template)" in built.output
    assert "not verified" not in built.output  # every entry was verified by running its tests
    assert "tests: run for 4 entries" in built.output

    wanted = {"repeat-rle", "repeat-balanced", "reworded-roman", "uncovered-3"}
    queries = [json.loads(q) for q in (CODE / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    renamed = [json.loads(q) for q in (CODE / "routing.jsonl").read_text(encoding="utf-8").splitlines()]
    queries += [q for q in renamed if q["id"] == "renamed-triangular"]
    wanted.add("renamed-triangular")
    picked = tmp_path / "queries.jsonl"
    picked.write_text("".join(json.dumps(q) + "\n" for q in queries if q["id"] in wanted), encoding="utf-8")
    out = tmp_path / "bench"
    result = run(
        "bench", "--library", tmp_path / "lib", "--queries", picked, "--checker", "tests", "--modes", "text-rag,graft",
        "--max-tokens", 160, "--out", out, "--model", gemma_path, "--n-threads", 2, "--decode", "lookup",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {(r["id"], r["mode"]): r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    for qid in ("repeat-rle", "repeat-balanced"):
        assert rows[qid, "graft"]["route"] == "graft" and rows[qid, "graft"]["correct"], rows[qid, "graft"]
        # a copied solution comes mostly from accepted drafts
        assert rows[qid, "graft"]["decode"] == "lookup"
        assert rows[qid, "graft"]["accepted_tokens"] > rows[qid, "graft"]["decode_tokens"] / 2
    # a renamed task: the entry's problem is restated in the query's names, so the copied solution uses them
    # (restated in the entry's own names, this one failed: its body used the entry's parameter name)
    renamed_row = rows["renamed-triangular", "graft"]
    assert (renamed_row["route"], renamed_row["entry_id"], renamed_row["correct"]) == ("graft", "code/triangular", True)
    assert "n_in" in renamed_row["text"], renamed_row["text"]
    assert rows["uncovered-3", "graft"]["route"] == "plain"
    for qid in wanted:
        if rows[qid, "graft"]["route"] == "graft":
            assert rows[qid, "graft"]["text"] == rows[qid, "text-rag"]["text"]
