"""The CLI contract that other tools rely on (build / ask --json / ask --queries / info)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvgraft_plugin.cli import main
from kvgraft_plugin.routing.router import DEFAULT_GUARDS

JSON_KEYS = {
    "text",
    "route",
    "entry_id",
    "score",
    "fallback_reason",
    "prefill_tokens",
    "restored_tokens",
    "decode_tokens",
    "ttft_ms",
    "total_ms",
    "decode",
    "decode_ms",
    "drafted_tokens",
    "accepted_tokens",
    "phases_ms",
    "finish_reason",
    "match",
    "notes",
    "cue",
}


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def cli_library(tmp_path_factory, gemma_path):
    src = tmp_path_factory.mktemp("src") / "src.jsonl"
    src.write_text(
        "\n".join(
            json.dumps(e)
            for e in [
                {"id": "mul", "problem": "What is 17 times 23?", "solution": "17 x 23 = 391.", "answer": "391"},
                {"id": "gcd", "problem": "What is the gcd of 84 and 126?", "solution": "It is 42.", "answer": "42"},
            ]
        )
    )
    lib = tmp_path_factory.mktemp("cli") / "lib"
    result = run("build", src, "--library", lib, "--model", gemma_path, "--n-threads", 2)
    assert result.exit_code == 0, result.output
    assert "built 2" in result.output
    return src, lib


def test_rebuild_is_incremental(cli_library):
    src, lib = cli_library
    result = run("build", src, "--library", lib, "--n-threads", 2)  # the library remembers its model
    assert result.exit_code == 0 and "built 0, unchanged 2" in result.output


def test_ask_json_contract(cli_library):
    _, lib = cli_library
    result = run("ask", "--library", lib, "--n-threads", 2, "--json", "What is 17 times 23?")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(out) == JSON_KEYS
    assert out["route"] == "graft" and out["entry_id"] == "mul" and out["fallback_reason"] is None
    assert out["cue"] == "same"  # the entry's problem asked again, not a related one
    assert out["text"] == "391" and out["restored_tokens"] > 0 and out["ttft_ms"] > 0
    assert out["decode"] == "lookup" and out["decode_ms"] > 0 and 0 <= out["accepted_tokens"] <= out["drafted_tokens"]
    assert {"check", "restore", "prefill", "first_token"} <= set(out["phases_ms"])
    # the entry's own problem: grafted as exact text, no search and no guard
    assert out["match"] == [{"guard": "exact", "entry_id": "mul", "passed": True, "reason": "the entry's own problem"}]
    reworded = run("ask", "--library", lib, "--n-threads", 2, "--json", "--max-tokens", 2, "what is 17 times 23?")
    out = json.loads(reworded.stdout.strip().splitlines()[-1])
    assert out["route"] == "graft" and {"embed", "search"} <= set(out["phases_ms"])
    assert [v["guard"] for v in out["match"]] == ["threshold", *(name for name, _ in DEFAULT_GUARDS)]
    assert [v["guard"] for v in out["match"][6:8]] == ["swap", "operators"]  # the shape guards, after "prefix"
    assert all(v["passed"] and v["entry_id"] == "mul" for v in out["match"])


def test_ask_queries_file(cli_library, tmp_path):
    _, lib = cli_library
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        json.dumps({"id": "a", "question": "What is 17 times 23?"})
        + "\n"
        + json.dumps({"id": "b", "question": "What is the capital of France?"})
        + "\n"
        + json.dumps({"id": "c", "question": "   "})
        + "\n"
    )
    result = run("ask", "--library", lib, "--n-threads", 2, "--queries", queries, "--json", "--max-tokens", 4)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["route"] == "graft" and rows[1]["route"] == "plain"
    assert rows[1]["fallback_reason"].startswith("no-match") and "error" in rows[2]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "problem": "p", "solution": "s"}', "not json"], "src.jsonl:2"),
        (
            ['{"id": "a", "problem": "p", "solution": "s"}', '{"id": "a", "problem": "q", "solution": "t"}'],
            "duplicate id 'a'",
        ),
        (['{"id": "a", "problem": "p", "solution": "It is 5.", "answer": "6"}'], "failed verification"),
    ],
)
def test_build_errors_are_one_clean_line(tmp_path, lines, message):
    src = tmp_path / "src.jsonl"
    src.write_text("\n".join(lines))
    result = run("build", src, "--library", tmp_path / "lib")
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "command",
    [["bench-graft"], ["doctor"], ["ask", "hello"], ["curate", "{src}", "--out", "{src}.out"], ["build", "{src}"]],
)
def test_every_command_reports_a_bad_setting_in_one_line(tmp_path, command):
    """The click group turns any KVGraftError into one line and exit 1, for every command."""
    src = tmp_path / "src.jsonl"
    src.write_text('{"id": "a", "problem": "What is 2 plus 2?", "solution": "It is 4.", "answer": "4"}\n')
    args = [a.format(src=src) for a in command]
    result = run(*args, "--n-ctx", 64, "--n-batch", 128, *(["--library", tmp_path / "lib"] if "build" in args else []))
    assert result.exit_code == 1 and "n_batch" in result.output and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_ask_with_a_json_schema_and_sampling_options(cli_library, tmp_path):
    _, lib = cli_library
    schema = '{"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}'
    result = run("ask", "--library", lib, "--n-threads", 2, "--json", "--json-schema", schema, "What is 17 times 23?")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["route"] == "graft" and set(json.loads(out["text"])) == {"answer"}
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    sampled = ["--temperature", 0.8, "--top-k", 20, "--top-p", 0.9, "--min-p", 0.05, "--repeat-penalty", 1.2,
               "--seed", 4, "--grammar-file", grammar]  # fmt: skip
    result = run("ask", "--library", lib, "--n-threads", 2, *sampled, "Is 391 odd?")
    assert result.exit_code == 0 and result.stdout.strip() in ("yes", "no"), result.output
    for bad, message in ((["--top-p", 2], "top_p"), (["--json-schema", "{"], "JSON"), (["--grammar-file", grammar,
                          "--json-schema", schema], "not both")):  # fmt: skip
        result = run("ask", "--library", lib, *bad, "What is 17 times 23?")
        assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output, result.output


def test_bench_graft_json_with_decode_rates(gemma_path):
    result = run("bench-graft", "--lengths", 64, "--repeat", 1, "--decode", "--json", "--model", gemma_path,
                 "--n-threads", 2)  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["rows"][0]["prefix_tokens"] == 64 and out["rows"][0]["restore_ms"] > 0
    assert set(out["decode_tok_s"]) == {"numpy argmax (before)", "chain greedy", "chain T=0.8 top-p min-p penalties"}
    assert all(rate > 0 for rate in out["decode_tok_s"].values())


def test_bench_graft_overflow_is_a_clean_error(gemma_path):
    result = run("bench-graft", "--lengths", 600, "--n-ctx", 512, "--model", gemma_path, "--n-threads", 2)
    assert result.exit_code == 1 and "n_ctx" in result.output and "Traceback" not in result.output, result.output


def test_skip_invalid(tmp_path, gemma_path):
    src = tmp_path / "src.jsonl"
    src.write_text(
        '{"id": "bad", "problem": "p", "solution": "It is 5.", "answer": "6"}\n'
        '{"id": "ok", "problem": "What is 2 plus 2?", "solution": "2 + 2 = 4.", "answer": "4"}\n'
    )
    result = run("build", src, "--library", tmp_path / "lib", "--skip-invalid", "--model", gemma_path, "--n-threads", 2)
    assert result.exit_code == 0 and "built 1" in result.output and "invalid 1" in result.output


def test_info(cli_library):
    _, lib = cli_library
    result = run("info", "--library", lib, "--json")
    data = json.loads(result.output)
    assert data["n_entries"] == 2 and data["index"] == {"kind": "flat", "rows": 2}
    assert data["fingerprint"]["swa_full"] is True and data["model"]["sha256"]
    human = run("info", "--library", lib)
    assert "mul" in human.output and "fidelity" in human.output


def test_unknown_library_is_a_clean_error(tmp_path):
    result = run("ask", "--library", tmp_path, "hello")
    assert result.exit_code == 1 and "not a kvgraft library" in result.output


def test_library_remembers_a_bundled_non_default_model(tmp_path, smol_path):
    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps({"id": "mul", "problem": "What is 17 times 23?", "solution": "391.", "answer": "391"}))
    lib = tmp_path / "lib"
    assert run("build", src, "--library", lib, "--model", smol_path, "--n-threads", 2).exit_code == 0
    again = run("build", src, "--library", lib, "--n-threads", 2)
    assert again.exit_code == 0 and "built 0, unchanged 1" in again.output
    data = json.loads(run("info", "--library", lib, "--json").stdout)
    assert data["model"]["bundled"] == "smollm2-135m" and data["fingerprint"]["arch"] == "llama"
