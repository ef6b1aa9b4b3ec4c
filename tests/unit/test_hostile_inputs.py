"""Hostile inputs of the third reliability round (issue 49): each is refused with a clear error, never a
traceback, and nothing is lost or written outside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_aliases import served  # noqa: F401  (the fixture: a library built on the scripted fake backend)

from kvgraft_plugin import Library
from kvgraft_plugin.cli import main
from kvgraft_plugin.core.exceptions import BackendError

DEEP = "[" * 5000 + "]" * 5000  # past Python's recursion limit for json.loads


def _clean(result) -> None:
    """A refusal: a non-zero exit with a message, not an exception escaping the command."""
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and "RecursionError" not in result.output


def test_deeply_nested_json_is_a_clean_error_in_queries_sources_and_manifests(served, tmp_path):  # noqa: F811
    lib, _ = served
    runner = CliRunner()
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "q", "question": "What is 17 times 23?"}) + "\n" + DEEP + "\n")
    result = runner.invoke(main, ["ask", "--library", str(lib), "--queries", str(queries)])
    _clean(result)
    assert "nested too deeply" in result.output
    source = tmp_path / "source.jsonl"
    source.write_text(DEEP + "\n")
    _clean(runner.invoke(main, ["build", str(source), "--library", str(tmp_path / "new")]))
    manifest = lib / "manifest.json"
    manifest.write_text(DEEP)
    for command in (["info", "--library", str(lib)], ["aliases", "--library", str(lib)]):
        result = runner.invoke(main, command)
        _clean(result)
        assert "corrupt" in result.output


def test_a_tampered_signed_manifest_is_refused_as_unsigned_not_a_crash(served):  # noqa: F811
    lib, _ = served
    key = b"k" * 32
    Library.open(lib).sign(key)
    (lib / "manifest.json").write_text(DEEP)
    library = Library.open(lib, key=key)
    assert not library.trusted and "signature" in library.untrusted_reason


def test_a_model_file_replaced_while_serving_is_refused_before_it_is_read(served, tmp_path):  # noqa: F811
    lib, open_engine = served
    engine = open_engine(lib, judge_model="off")
    assert engine.ask("What is 17 times 23?", max_tokens=4, stop=[]).route == "graft"
    model = Path(engine.backend.model_path)
    with model.open("r+b") as f:  # truncated in place, as the hostile pass did to the mapped GGUF
        f.truncate(3)
    with pytest.raises(BackendError, match="changed on disk since it was opened"):
        engine.ask("What is 17 times 23?", max_tokens=4, stop=[])


def test_a_judge_whose_file_changed_refuses_instead_of_reading_it(tmp_path):
    from test_judge import FakeBackend

    from kvgraft_plugin.routing.judge import Judge

    model = tmp_path / "judge.gguf"
    model.write_bytes(b"judge weights")
    backend = FakeBackend()
    backend.model_path = model  # type: ignore[attr-defined]
    judge = Judge(backend)
    judge.view_margin(0, "What is 17 times 23?", "Compute 17 times 23.")  # the file as opened: read
    fed = len(backend.prefilled)
    model.write_bytes(b"other weights, longer")
    # every way the judge reads the model checks the file first: a view, the rewording check, the numerals
    for score in (
        lambda: judge.view_margin(1, "What is 17 times 23?", "Compute 17 times 23."),
        lambda: judge.rewording("What is 17 times 23?", "What is 17 times 24?"),
        lambda: judge.numerals("What is 17 times 23?", "What is seventeen times 23?"),
    ):
        with pytest.raises(BackendError, match="judge's model file"):
            score()
    assert len(backend.prefilled) == fed  # nothing was fed to the model after its file changed


def test_calibrate_refuses_a_label_naming_no_entry_and_leaves_out_an_empty_question(served):  # noqa: F811
    from kvgraft_plugin.core.exceptions import ConfigError
    from kvgraft_plugin.tools.calibrate import calibrate

    lib, open_engine = served
    engine = open_engine(lib)
    stale = [{"id": "q1", "question": "What is 17 times 23?", "expect_entry": "gone"}]
    with pytest.raises(ConfigError, match="expect_entry names no entry of the library in queries q1"):
        calibrate(engine, stale)  # before: counted as a wrong graft, which biased the threshold
    rows = [
        {"id": "q1", "question": "What is 17 times 23?", "expect_entry": "mul"},
        {"id": "q2", "question": " ", "expect_entry": None},  # before: QueryError aborted the whole run
    ]
    chosen, _ = calibrate(engine, rows)
    assert (chosen.right, chosen.wrong, chosen.covered) == (1, 0, 1)
