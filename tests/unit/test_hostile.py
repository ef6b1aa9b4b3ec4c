"""Hostile inputs of the third reliability round (issue 49): each is refused with a clear error, never a
traceback, and nothing is lost or written outside."""

from __future__ import annotations

import json

from click.testing import CliRunner
from test_aliases import served  # noqa: F401  (the fixture: a library built on the scripted fake backend)

from kvgraft_plugin import Library
from kvgraft_plugin.cli import main

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
