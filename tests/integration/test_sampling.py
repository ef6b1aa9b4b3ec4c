"""Sampling through llama.cpp's sampler chain on the real models: greedy is still the argmax of the step
logits, every route samples alike at any temperature with penalties on, and grammars constrain."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvgraft_plugin import ConfigError, GraftEngine, SamplingParams, json_schema_grammar

QUESTIONS = ["What is 17 times 23?", "What is the greatest common divisor of 84 and 126?", "What is 0xff in decimal?"]
#: Every part of the chain at once: top-k, top-p, min-p, temperature, a seeded draw and all three penalties.
HOT = SamplingParams(
    temperature=0.8, top_k=40, top_p=0.95, min_p=0.02, repeat_penalty=1.3, presence_penalty=0.4,
    frequency_penalty=0.2, seed=11,
)  # fmt: skip
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "unit": {"type": "string", "maxLength": 12}},
    "required": ["answer", "unit"],
}


@pytest.fixture(scope="module")
def engine(small_library, gemma_path):
    with GraftEngine(small_library, model_path=str(gemma_path), n_threads=2) as engine:
        yield engine


@pytest.mark.parametrize("model", ["gemma_path", "smol_path"])
def test_greedy_chain_picks_the_argmax_of_each_step(model, request):
    """The greedy sampler over llama.cpp's logits takes exactly the tokens ``np.argmax`` took before."""
    with GraftEngine(None, model_path=str(request.getfixturevalue(model)), n_threads=2) as engine:

        def both(backend):
            prompt = backend.tokenize("Problem: Write a haiku about the sea.\nAnswer:", add_bos=True)
            backend.reset()
            logits, reference = backend.prefill(prompt), []
            for _ in range(24):
                reference.append(int(np.argmax(logits)))
                logits = backend.prefill([reference[-1]])
            backend.reset()
            backend.prefill(prompt)
            sampler, chained = backend.sampler(SamplingParams(), prompt), []
            for _ in range(24):
                chained.append(sampler.sample())
                backend.decode(chained[-1])
            sampler.close()
            backend.reset()
            return reference, chained

        reference, chained = engine.run_exclusive(both)
    assert chained == reference


@pytest.mark.parametrize("question", QUESTIONS)
def test_graft_samples_exactly_as_text_rag(engine, question):
    """Penalties see the whole context on both routes (restored or prefilled), and the draw the same seed."""
    graft = engine.ask(question, mode="graft", sampling=HOT, max_tokens=32, stop=[])
    text_rag = engine.ask(question, mode="text-rag", sampling=HOT, max_tokens=32, stop=[])
    assert (graft.route, text_rag.route) == ("graft", "text-rag") and graft.restored_tokens > 0
    assert graft.text == text_rag.text and graft.decode_tokens == text_rag.decode_tokens


def test_the_settings_are_live(engine):
    """Without penalties, or with another seed, the same grafted request says something else."""
    hot = engine.ask(QUESTIONS[0], mode="graft", sampling=HOT, max_tokens=32, stop=[]).text
    others = [
        engine.ask(QUESTIONS[0], mode="graft", sampling=HOT.replace(**change), max_tokens=32, stop=[]).text
        for change in ({"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}, {"seed": 12})
    ]
    assert all(other != hot for other in others)


def test_fields_as_keywords_and_the_same_seed_repeats(engine):
    once = engine.ask(QUESTIONS[0], mode="plain", temperature=0.9, seed=5, top_p=0.9, max_tokens=24, stop=[])
    again = engine.ask(QUESTIONS[0], mode="plain", sampling=SamplingParams(temperature=0.9, seed=5, top_p=0.9),
                       max_tokens=24, stop=[])  # fmt: skip
    assert once.text == again.text
    with pytest.raises(ConfigError, match="unknown keyword"):
        engine.ask(QUESTIONS[0], temprature=0.5)
    with pytest.raises(ConfigError, match="top_p"):
        engine.ask(QUESTIONS[0], top_p=0.0)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_json_schema_grammar_constrains_every_route_alike(engine, temperature):
    grammar = json_schema_grammar(ANSWER_SCHEMA)
    graft = engine.ask(QUESTIONS[0], mode="graft", grammar=grammar, temperature=temperature, max_tokens=60)
    text_rag = engine.ask(QUESTIONS[0], mode="text-rag", grammar=grammar, temperature=temperature, max_tokens=60)
    assert graft.route == "graft" and graft.text == text_rag.text
    assert graft.finish_reason == "eog"  # the grammar ended it, not the answer format's newline stop
    value = json.loads(graft.text)
    assert set(value) == {"answer", "unit"} and isinstance(value["answer"], int) and len(value["unit"]) <= 12
    plain = engine.ask(QUESTIONS[0], mode="plain", max_tokens=60)
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain.text)  # unconstrained, the model does not answer in JSON


def test_a_bad_grammar_is_a_config_error_and_the_engine_goes_on(engine):
    with pytest.raises(ConfigError, match="grammar"):
        engine.ask(QUESTIONS[0], grammar="root ::= (")
    assert engine.ask(QUESTIONS[0]).text == "391"
