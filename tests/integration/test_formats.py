"""Answer formats and ids: a ``solution`` library (code, kept verbatim) grafts exactly like text RAG on both
bundled models, stops at the end marker, and keeps the solution's indentation and lines; ids with slashes,
spaces and unicode build, graft, verify and sign."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvgraft_plugin import GraftEngine, Library
from kvgraft_plugin.cli import main

_TABLE = "\n".join(f"        {n}: {n * n * n}," for n in range(1, 90))
CODE = [
    {
        "id": "Code/0",
        "problem": 'def clamp(x, low, high):\n    """Return x limited to the range [low, high]."""',
        "solution": "    if x < low:\n        return low\n    if x > high:\n        return high\n    return x",
    },
    {
        "id": "tâche 1: somme des carrés",
        "problem": 'def sum_of_squares(numbers):\n    """Return the sum of the squares of the numbers."""',
        "solution": "    total = 0\n    for n in numbers:\n        total += n * n\n    return total",
    },
    {
        "id": "Code/cubes table",
        "problem": 'def cube(n):\n    """Return n cubed for 1 <= n < 90, from a table."""',
        "solution": f"    table = {{\n{_TABLE}\n    }}\n    return table[n]",  # past Gemma's 512-token window
    },
]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module", params=["gemma", "smol"])
def code_library(request, tmp_path_factory):
    model_path = request.getfixturevalue(f"{request.param}_path")
    src = tmp_path_factory.mktemp("src") / "code.jsonl"
    src.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in CODE), encoding="utf-8")
    lib = tmp_path_factory.mktemp("code") / "lib"
    result = run("build", src, "--library", lib, "--model", model_path, "--n-threads", 2)
    assert result.exit_code == 0 and "(solution format)" in result.output, result.output
    assert "3 entries have neither an answer nor tests and were not verified" in result.output
    return lib, model_path, request.param


def test_solution_library_is_exact_and_its_ids_are_any_text(code_library):
    lib, _, model = code_library
    library = Library.open(lib)
    assert library.answer_format == "solution" and set(library.entries) == {e["id"] for e in CODE}
    assert {r.fidelity for r in library.entries.values()} == {"exact"}  # restore + probe logits bitwise equal
    assert len({r.state_file for r in library.entries.values()}) == 3
    if model == "gemma":
        assert max(len(r.tokens) for r in library.entries.values()) > 600


def test_graft_writes_the_whole_solution_like_text_rag(code_library):
    lib, model_path, model = code_library
    with GraftEngine(lib, model_path=str(model_path), n_threads=2) as engine:
        for entry in CODE[:2]:
            question = entry["problem"]
            graft = engine.ask(question, max_tokens=120)
            text_rag = engine.ask(question, mode="text-rag", entry_id=entry["id"], max_tokens=120)
            assert graft.route == "graft" and graft.entry_id == entry["id"], graft.fallback_reason
            assert graft.text == text_rag.text and graft.decode_tokens == text_rag.decode_tokens
            if model == "gemma" or entry is CODE[0]:
                # copied verbatim (several lines, indentation kept) up to the end marker; SmolLM2-Instruct
                # under the text template loops on the second task (measured), whatever the route
                assert graft.finish_reason == "stop" and graft.text == entry["solution"]


def test_ids_with_slashes_spaces_and_unicode_verify_and_sign(code_library, tmp_path):
    lib, model_path, _ = code_library
    assert run("verify", "--library", lib, "--fidelity", "--model", model_path, "--n-threads", 2).exit_code == 0
    key = tmp_path / "key"
    assert run("keygen", key).exit_code == 0 and run("sign", "--library", lib, "--key-file", key).exit_code == 0
    with GraftEngine(lib, model_path=str(model_path), n_threads=2, key_file=str(key)) as engine:
        result = engine.ask(CODE[1]["problem"], max_tokens=60)
    assert result.route == "graft" and result.entry_id == "tâche 1: somme des carrés"


def test_stop_overrides_the_format_default(code_library):
    lib, model_path, _ = code_library
    with GraftEngine(lib, model_path=str(model_path), n_threads=2) as engine:
        result = engine.ask(CODE[0]["problem"], max_tokens=120, stop=["return"])
    assert result.finish_reason == "stop" and result.text == "    if x < low:\n        "
