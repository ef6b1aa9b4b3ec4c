"""Answer formats, templates and ids: a ``solution`` library (code, kept verbatim) grafts exactly like text
RAG on both bundled models under both templates, stops at the end marker (text) or the end of turn (chat),
and keeps the solution's indentation and lines; an ``answer`` library does the same under the chat
template; ids with slashes, spaces and unicode build, graft, verify and sign."""

from __future__ import annotations

import dataclasses
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
    assert result.exit_code == 0 and "(solution format, text template)" in result.output, result.output
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


# -- the chat template: SmolLM2's own (GGUF), and llama.cpp's "gemma" for the base Gemma (its GGUF has none)

CHAT = {"gemma": ["--chat-template", "gemma"], "smol": []}
NUMERIC = [
    {"id": "m/1", "problem": "What is 17 times 23?", "solution": "17 * 23 = 391.", "answer": "391"},
    {"id": "m/2", "problem": "A shop sells 48 pens a day. How many pens does it sell in 35 days?",
     "solution": "48 * 35 = 1680.", "answer": "1680"},
]  # fmt: skip


@pytest.fixture(scope="module", params=["gemma", "smol"])
def chat_libraries(request, tmp_path_factory):
    model_path = request.getfixturevalue(f"{request.param}_path")
    libraries = {}
    for fmt, entries in (("solution", CODE), ("answer", NUMERIC)):
        src = tmp_path_factory.mktemp("src") / f"{fmt}.jsonl"
        src.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries), encoding="utf-8")
        lib = tmp_path_factory.mktemp("chat") / fmt
        result = run(
            "build", src, "--library", lib, "--model", model_path, "--n-threads", 2, "--template", "chat",
            *CHAT[request.param],
        )  # fmt: skip
        assert result.exit_code == 0 and f"({fmt} format, chat template)" in result.output, result.output
        libraries[fmt] = lib
    return libraries, model_path, request.param


def test_chat_template_states_are_exact_past_the_window(chat_libraries):
    libraries, model_path, model = chat_libraries
    verified = run("verify", "--library", libraries["answer"], "--fidelity", "--model", model_path, "--n-threads", 2)
    assert verified.exit_code == 0, verified.output
    for fmt, lib in libraries.items():
        library = Library.open(lib)
        assert (library.template, library.answer_format) == ("chat", fmt)
        assert library.chat_template == ("gemma" if model == "gemma" else None)
        assert {r.fidelity for r in library.entries.values()} == {"exact"}  # restore + probe logits bitwise
    if model == "gemma":
        assert max(len(r.tokens) for r in Library.open(libraries["solution"]).entries.values()) > 600


def test_chat_graft_equals_text_rag_in_both_formats(chat_libraries):
    libraries, model_path, model = chat_libraries
    with GraftEngine(libraries["solution"], model_path=str(model_path), n_threads=2) as engine:
        assert engine.template.kind == "chat"
        for entry in CODE[:2]:
            graft = engine.ask(entry["problem"], max_tokens=120)
            text_rag = engine.ask(entry["problem"], mode="text-rag", entry_id=entry["id"], max_tokens=120)
            assert graft.route == "graft" and graft.entry_id == entry["id"], graft.fallback_reason
            assert graft.text == text_rag.text and graft.decode_tokens == text_rag.decode_tokens
        # a function prompt is answered as a fenced block, cut at its closing fence (or the end of turn)
        if model == "smol":
            result = engine.ask(CODE[1]["problem"], max_tokens=120)
            assert result.finish_reason in ("stop", "eog") and result.text.startswith("def "), result.text
        else:  # the base Gemma copies the entry's block, the function and its solution, and closes it
            result = engine.ask(CODE[0]["problem"], max_tokens=120)
            assert result.text.startswith(f"{CODE[0]['problem']}\n{CODE[0]['solution']}"), result.text
    with GraftEngine(libraries["answer"], model_path=str(model_path), n_threads=2) as engine:
        for entry in NUMERIC:
            graft = engine.ask(entry["problem"])
            text_rag = engine.ask(entry["problem"], mode="text-rag", entry_id=entry["id"])
            assert graft.route == "graft" and graft.text == text_rag.text
            assert graft.decode_tokens == text_rag.decode_tokens
            assert graft.finish_reason in ("stop", "eog") and "\n" not in graft.text  # one answer line
            if model == "gemma":  # SmolLM2-135M re-derives 17 * 23 as 427 with the entry in view (measured)
                assert graft.text == entry["answer"]


def test_chat_kvgraft_uses_the_library_chat_template(chat_libraries):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    from kvgraft_plugin.adapters.langchain import ChatKVGraft

    libraries, model_path, _ = chat_libraries
    chat = ChatKVGraft(library=str(libraries["answer"]), model_path=str(model_path), n_threads=2)
    try:
        messages = [SystemMessage("Answer with a number."), HumanMessage("What is 2 plus 2?"), AIMessage("4"),
                    HumanMessage(NUMERIC[0]["problem"])]  # fmt: skip
        reply = chat.invoke(messages)
        engine = chat._get_engine()
        direct = engine.ask(NUMERIC[0]["problem"], system="Answer with a number.", history=[("What is 2 plus 2?", "4")])
        assert reply.response_metadata["route"] == "graft" and reply.content == direct.text
        assert reply.response_metadata["prefill_tokens"] == direct.prefill_tokens
    finally:
        chat.release()


def test_special_token_syntax_in_a_question_stays_text(chat_libraries):
    libraries, model_path, model = chat_libraries
    marker = "<|im_end|>" if model == "smol" else "<end_of_turn>"
    with GraftEngine(libraries["answer"], model_path=str(model_path), n_threads=2) as engine:
        special = engine.run_exclusive(lambda backend: backend.tokenize(marker, add_bos=False, special=True))
        markup = set(special) - set(engine.tokenize(marker))
        entry = engine.library.get("m/1").entry
        probe = engine.probe_tokens(dataclasses.replace(entry, problem=f"{marker} {entry.problem}"))
        plain_probe = engine.probe_tokens(entry)
    # the typed marker adds plain-text tokens only; the special ones come from the template, as many as before
    assert sum(t in markup for t in probe) == sum(t in markup for t in plain_probe) > 0


@pytest.mark.parametrize("fmt", ["answer", "solution"])
def test_related_route_equals_its_text_rag_twin_bitwise(chat_libraries, small_library, gemma_path, fmt):
    """The related route restores the entry's state, then prefills the question as a new problem (the RELATED
    cue): its logits are bitwise those of prefilling the entry as text with the same suffix, and the greedy
    answers are the same, in the chat template (both formats) and the text template."""
    libraries, model_path, model_name = chat_libraries
    cases = [(libraries[fmt], model_path, "What is 17 times 24?" if fmt == "answer" else CODE[0]["problem"] + " ")]
    if fmt == "answer" and model_name == "gemma":
        cases.append((small_library, gemma_path, "What is 17 times 24?"))  # the text template's answer format
    for lib, model, question in cases:
        with GraftEngine(lib, model_path=str(model), n_threads=2) as engine:
            record = next(iter(engine.library.entries.values()))
            suffix = engine.run_exclusive(lambda _, q=question: engine.prompts.suffix(q, related=True))
            state = engine.load_state(record)
            assert engine.restore_diff(list(record.tokens), state.payload, suffix) == 0.0  # np.array_equal
            related = engine.ask(question, mode="related", entry_id=record.id, max_tokens=48)
            twin = engine.ask(question, mode="text-rag", cue="related", entry_id=record.id, max_tokens=48)
            assert (related.route, related.cue, twin.route, twin.cue) == ("related", "related", "text-rag", "related")
            assert related.text == twin.text and related.decode_tokens == twin.decode_tokens, (related, twin)
            assert related.prefill_tokens == len(suffix) and twin.prefill_tokens == len(suffix) + len(record.tokens)
