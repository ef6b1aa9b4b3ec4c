"""Lookup decoding on the bundled models: a batch of up to 16 tokens is bitwise 16 one-token steps on this
build, lookup's text is step's text on every route (greedy and sampled), and a copied answer is drafted
from the grafted entry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft_plugin import GraftEngine, SamplingParams, read_source
from kvgraft_plugin.curation.build import build_library

#: What the Makefile's build (no llamafile, no repacked weights, no tiled K-quant matmul) proves on both models.
CLAIMED_BATCH = 16
CODE = Path(__file__).resolve().parents[2] / "examples" / "code"
HOT = SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05, repeat_penalty=1.2, seed=5)
#: (question, route mode, sampling): grafted, text RAG and plain, greedy and sampled with penalties.
RUNS = [
    ("What is 17 times 23?", "auto", SamplingParams()),
    ("What is 17 times 23?", "auto", HOT),
    ("Compute the greatest common divisor of 84 and 126.", "text-rag", SamplingParams()),
    ("What is 0xff in decimal?", "text-rag", HOT),
    ("Name three rivers in Europe.", "auto", SamplingParams()),
    ("Name three rivers in Europe.", "auto", HOT),
]


@pytest.mark.parametrize("model", ["gemma", "smol"])
def test_batches_are_bitwise_one_token_steps(model, request):
    engine = request.getfixturevalue(model)
    report = engine.lookup.measure()
    assert report.max_batch == CLAIMED_BATCH
    assert [r.k for r in report.rows] == [k for k in range(2, CLAIMED_BATCH + 1) for _ in (0, 1)]
    assert all(r.bitwise and r.max_diff == 0.0 and r.kl == 0.0 for r in report.rows)


def test_the_tiled_k_quant_matmul_breaks_batches_of_eight(gemma_path, tmp_path):
    """The check can fail: with ggml's tiled K-quant matmul on, Gemma 3's batches of 8 differ from steps."""
    run = subprocess.run(
        [sys.executable, "-m", "kvgraft_plugin.cli", "doctor", "--invariance", "--json", "--n-threads", "2",
         "--model", str(gemma_path)],
        capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "GGML_CPU_TILED_MM": "1", "XDG_CACHE_HOME": str(tmp_path)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["max_batch"] == 7
    first = next(r for r in report["rows"] if not r["bitwise"])
    assert first["k"] == 8 and first["max_diff"] > 0


@pytest.fixture(scope="module")
def smol_library(tmp_path_factory, smol, example_entries):
    path = tmp_path_factory.mktemp("smol") / "library"
    build_library(path, [e for e in example_entries if e.id in {"mul-17x23", "gcd-84-126", "hex-ff"}], engine=smol)
    return path


@pytest.mark.parametrize(("model", "library"), [("gemma_path", "small_library"), ("smol_path", "smol_library")])
def test_lookup_gives_the_step_text_on_every_route(model, library, request):
    with GraftEngine(
        request.getfixturevalue(library), model_path=str(request.getfixturevalue(model)), n_threads=2
    ) as engine:
        assert engine.lookup.max_batch == CLAIMED_BATCH
        routes = set()
        for question, mode, sampling in RUNS:
            step = engine.ask(question, mode=mode, decode="step", max_tokens=24, sampling=sampling)
            lookup = engine.ask(question, mode=mode, decode="lookup", max_tokens=24, sampling=sampling)
            assert (lookup.text, lookup.decode_tokens, lookup.finish_reason) == (
                step.text, step.decode_tokens, step.finish_reason,
            ), (question, mode, sampling)  # fmt: skip
            assert (step.decode, lookup.decode, step.drafted_tokens) == ("step", "lookup", 0)
            routes.add(lookup.route)
        assert routes == {"graft", "text-rag", "plain"}


def test_a_copied_solution_is_drafted_from_the_entry(tmp_path, gemma_path):
    """A repeated code task copies its verified solution: most tokens come from accepted drafts, and
    graft, text RAG and step decoding give one text."""
    entries = [e for e in read_source(CODE / "library.jsonl") if e.id in {"code/rle", "code/roman"}]
    with GraftEngine(None, model_path=str(gemma_path), n_threads=2, answer_format="solution") as builder:
        build_library(tmp_path / "lib", entries, engine=builder)
    with GraftEngine(tmp_path / "lib", model_path=str(gemma_path), n_threads=2) as engine:
        for entry in entries:
            step = engine.ask(entry.problem, decode="step", max_tokens=160)
            lookup = engine.ask(entry.problem, decode="lookup", max_tokens=160)
            rag = engine.ask(entry.problem, mode="text-rag", decode="lookup", max_tokens=160)
            assert lookup.route == "graft" and lookup.text == step.text == rag.text
            assert lookup.accepted_tokens >= 0.6 * lookup.decode_tokens, lookup
            assert (rag.drafted_tokens, rag.accepted_tokens) == (lookup.drafted_tokens, lookup.accepted_tokens)


@pytest.mark.parametrize(("model", "library"), [("gemma_path", "small_library"), ("smol_path", "smol_library")])
def test_a_served_model_that_cannot_judge_is_not_its_own_judge(model, library, request, caplog):
    # Gemma 270M is a base model (no chat template): never asked. SmolLM2-135M-Instruct is asked the judge
    # check and lets a near-miss through: routing keeps the word guards, and says why in the log.
    path = request.getfixturevalue(model)
    with caplog.at_level("INFO", logger="kvgraft_plugin.routing.library_routing"):
        with GraftEngine(request.getfixturevalue(library), model_path=str(path), n_threads=2) as engine:
            assert engine.routing.judge(engine.config) is None
            result = engine.ask("What is 17 times 23?", max_tokens=4)
            assert result.route == "graft" and "judge" not in [v["guard"] for v in result.match]
    if model == "smol_path":
        assert engine.routing.served == path and "smollm2-135m fails the judge check" in caplog.text
    else:
        assert engine.routing.served is None and "judge check" not in caplog.text
