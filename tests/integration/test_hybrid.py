"""A hybrid model end to end: a library built by ``kvgraft build`` on the matrix's tiny LFM2 (short
convolutions beside attention) and Qwen3.5 (Gated DeltaNet beside attention, M-RoPE cells) grafts bitwise
its text RAG twin through ``kvgraft ask``, LangChain and ``kvgraft serve``."""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner
from openai import OpenAI

from kvgraft_plugin import Entry, GraftEngine, build_library
from kvgraft_plugin.adapters.langchain import KVGraftLLM
from kvgraft_plugin.cli import main
from kvgraft_plugin.tools.doctor import MATRIX_SETTINGS
from kvgraft_plugin.tools.tiny_models import TINY_ARCHS, write_tiny_model
from tests.helpers import KEY, start_server

ENTRIES = [
    {"id": "e1", "problem": "What is 17 times 23?", "solution": "17 times 23 is 391.", "answer": "391"},
    {"id": "e2", "problem": "Name the largest planet.", "solution": "It is Jupiter.", "answer": "Jupiter"},
]
SETTINGS = [f"--{key.replace('_', '-')}={value}" for key, value in MATRIX_SETTINGS.items()]
TOKENS = 12


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_a_hybrid_library_grafts_as_text_rag_through_ask_langchain_and_serve(arch, tmp_path):
    assert TINY_ARCHS[arch].hybrid
    model, library, source = write_tiny_model(tmp_path / f"{arch}.gguf", arch), tmp_path / "lib", tmp_path / "src.jsonl"
    source.write_text("".join(json.dumps(entry) + "\n" for entry in ENTRIES))
    runner = CliRunner()
    built = runner.invoke(main, ["build", str(source), "--library", str(library), "--model", str(model), *SETTINGS])
    assert built.exit_code == 0, built.output

    def ask(question: str, mode: str) -> dict:
        args = ["ask", question, "--library", str(library), "--model", str(model), "--mode", mode, "--json"]
        result = runner.invoke(main, [*args, "--max-tokens", str(TOKENS), *SETTINGS])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    text_rag = {}
    for entry in ENTRIES:
        graft, twin, auto = (ask(entry["problem"], mode) for mode in ("graft", "text-rag", "auto"))
        assert (graft["route"], graft["fallback_reason"], auto["route"]) == ("graft", None, "graft"), graft
        assert graft["text"] == twin["text"] == auto["text"] and graft["restored_tokens"] > 0
        text_rag[entry["problem"]] = twin["text"]

    llm = KVGraftLLM(library=str(library), model_path=str(model), max_tokens=TOKENS)
    try:
        assert llm._get_engine().backend.layout.recurrent
        for question, expected in text_rag.items():
            generation = llm.generate([question]).generations[0][0]
            assert generation.text == expected and generation.generation_info["route"] == "graft"
    finally:
        llm.release()

    proc, url = start_server(library, model, tmp_path, *SETTINGS)
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key=KEY)
        for question, expected in text_rag.items():
            completion = client.completions.create(model="kvgraft", prompt=question, max_tokens=TOKENS)
            extra = completion.model_extra["kvgraft"]
            assert completion.choices[0].text == expected and extra["route"] == "graft", extra
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


@pytest.mark.parametrize("arch", ["mamba", "lfm2", "qwen35"])
def test_recurrent_and_hybrid_requests_batch_as_they_answer_alone(arch, tmp_path):
    """llama.cpp keeps a recurrent state per sequence: a graft restored into any sequence of a batched
    context, text RAG and plain answers decoded together equal the serial engine's, and the doctor's
    measurement batches all four."""
    model = write_tiny_model(tmp_path / f"{arch}.gguf", arch)
    entries = [Entry(e["id"], e["problem"], e["solution"], e["answer"]) for e in ENTRIES]
    with GraftEngine(None, model_path=str(model), **MATRIX_SETTINGS) as builder:  # type: ignore[arg-type]
        build_library(tmp_path / "lib", entries, engine=builder)
    requests = [(e.problem, mode) for e in entries for mode in ("auto", "text-rag")] + [("the a is", "plain")] * 2

    def ask_all(engine: GraftEngine) -> list:
        with ThreadPoolExecutor(len(requests)) as pool:
            return list(pool.map(lambda r: engine.ask(r[0], mode=r[1], max_tokens=TOKENS, stop=[]), requests))

    with GraftEngine(tmp_path / "lib", model_path=str(model), **MATRIX_SETTINGS) as engine:  # type: ignore[arg-type]
        serial = [engine.ask(q, mode=mode, max_tokens=TOKENS, stop=[]) for q, mode in requests]
    settings = {**MATRIX_SETTINGS, "max_batch": 4}
    with GraftEngine(tmp_path / "lib", model_path=str(model), **settings) as engine:  # type: ignore[arg-type]
        assert engine.max_batch == 4
        batched = ask_all(engine)
        stats = engine.batch_stats
    assert [r.route for r in serial] == ["graft", "text-rag"] * 2 + ["plain"] * 2
    assert [(r.route, r.text, r.decode_tokens) for r in batched] == [(r.route, r.text, r.decode_tokens) for r in serial]
    assert max(stats.steps) > 1  # sequences really were decoded together
