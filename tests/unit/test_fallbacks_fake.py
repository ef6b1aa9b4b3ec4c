"""A library built and served on the scripted fake backend and a bag-of-words embedder: graft equals text
RAG, and every fault that the digests and the state checks decide falls back with its reason, in
milliseconds (the real-model tests cover the same faults end to end)."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
from test_engine_fake import ScriptedBackend

from kvgraft_plugin import Entry, GraftEngine, IntegrityError, Library
from kvgraft_plugin.curation.build import build_library

ENTRIES = [
    Entry("mul", "What is 17 times 23?", "17 * 23 = 391.", "391"),
    Entry("gcd", "What is the greatest common divisor of 84 and 126?", "gcd(84, 126) = 42.", "42"),
]


class BagOfWords:
    """An embedder for tests: hashed word counts, L2-normalised."""

    name, files_sha256, dim = "test:bag-of-words", "", 64

    @property
    def identity(self) -> dict:
        return {"name": self.name, "files_sha256": self.files_sha256, "dim": self.dim}

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.sha256(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(library folder, a function that opens an engine on it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"not a model")
    engines: list[GraftEngine] = []

    def open_engine(library) -> GraftEngine:
        backend = ScriptedBackend(model, b"391.")
        engine = GraftEngine(library, backend=backend, embedder=BagOfWords(), n_threads=1, decode="step")
        engines.append(engine)
        return engine

    lib = tmp_path / "lib"
    build_library(lib, ENTRIES, engine=open_engine(None))
    yield lib, open_engine
    for engine in engines:
        engine.close()


def test_a_graft_on_the_fake_backend_equals_text_rag(served):
    lib, open_engine = served
    engine = open_engine(lib)
    graft = engine.ask("What is 17 times 23?", max_tokens=8, stop=[])
    text_rag = engine.ask("What is 17 times 23?", mode="text-rag", max_tokens=8, stop=[])
    assert (graft.route, graft.entry_id, graft.fallback_reason) == ("graft", "mul", None)
    assert graft.text == text_rag.text == "391." and graft.restored_tokens > 0


def test_the_entry_text_is_hashed_once_per_graft(served, monkeypatch):
    import kvgraft_plugin.engine.planner as planner_module
    import kvgraft_plugin.library.library as library_module

    lib, open_engine = served
    engine = open_engine(lib)
    calls: list[str] = []
    original = library_module.source_sha256

    def counted(entry):
        calls.append(entry.id)
        return original(entry)

    monkeypatch.setattr(library_module, "source_sha256", counted)
    monkeypatch.setattr(planner_module, "source_sha256", counted)
    result = engine.ask("x", mode="graft", entry_id="mul", max_tokens=4, stop=[])
    assert result.route == "graft" and calls == ["mul"]


def state_file(lib, entry_id: str):
    return lib / Library.open(lib).get(entry_id).state_file


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda path: path.write_bytes(path.read_bytes()[:-3] + b"xyz"), "integrity"),
        (lambda path: path.write_bytes(path.read_bytes()[:40]), "integrity"),
        (lambda path: path.unlink(), "missing"),
    ],
    ids=["flipped-tail", "truncated", "deleted"],
)
def test_a_damaged_state_falls_back_to_text_rag_with_its_reason(served, damage, reason):
    lib, open_engine = served
    damage(state_file(lib, "mul"))
    result = open_engine(lib).ask("What is 17 times 23?", max_tokens=8, stop=[])
    assert (result.route, result.entry_id, result.text) == ("text-rag", "mul", "391.")
    assert result.fallback_reason.startswith(f"{reason}: ")


def test_a_state_whose_bytes_the_backend_refuses_is_served_by_text_rag(served):
    """The digest matches (the file is as built) but the payload is not what the runtime reads back."""
    lib, open_engine = served
    engine = open_engine(lib)

    def refuse(payload, n_tokens):
        raise IntegrityError("state holds 0 positions")

    engine._states._check_payload = refuse  # what Backend.check_state says of bytes it cannot read
    result = engine.ask("What is 17 times 23?", max_tokens=8, stop=[])
    assert result.route == "text-rag" and result.fallback_reason.startswith("integrity: ")


def test_a_library_judge_that_is_not_on_this_machine_leaves_the_word_guards(served, caplog):
    lib, open_engine = served
    library = Library.open(lib)
    library.routing = {**library.routing, "judge": {"model": "no-such-judge.gguf", "threshold": 1.0}}
    library.save()
    engine = open_engine(lib)
    with caplog.at_level("WARNING", logger="kvgraft_plugin.routing.library_routing"):
        near = engine.ask("What is 17 plus 23?", max_tokens=8, stop=[])
        graft = engine.ask("What is 17 times 23?", max_tokens=8, stop=[])
    assert near.route == "plain" and [v["guard"] for v in near.match if not v["passed"]] == ["terms"]  # words decided
    assert graft.route == "graft"
    assert sum("no-such-judge.gguf" in r.message for r in caplog.records) == 1  # said once, not per request
    with pytest.raises(Exception, match="no-such-judge"):  # asked for by name, an absent judge is an error
        engine.ask("What is 17 times 23?", routing={"judge_model": "no-such-judge.gguf"})
