"""Routing on the code library with the real MiniLM and a real faiss index (no LLM is needed to route):
renamed tasks match, every generated near-miss and uncovered task is refused, and the guards are what
refuses them (cosine alone grafts them)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from kvgraft_plugin.library.index import Embedder, VectorIndex, geometry_threshold
from kvgraft_plugin.library.library import read_source
from kvgraft_plugin.routing.router import DEFAULT_GUARDS, Match, Router

CODE = Path(__file__).resolve().parents[2] / "examples" / "code"


@pytest.fixture(scope="module")
def routers():
    entries = {e.id: e for e in read_source(CODE / "library.jsonl")}
    embedder = Embedder()
    index = VectorIndex(embedder.encode(["x"]).shape[1])
    index.add(list(entries), embedder.encode([e.problem for e in entries.values()]))

    def make(guards):
        return Router(
            embedder.encode,
            lambda vector, k: [(h.entry_id, h.score) for h in index.search(vector, k)],
            entries,
            threshold=geometry_threshold(index),
            guards=guards,
        )

    return make(DEFAULT_GUARDS), make(())


def outcomes(router):
    queries = [json.loads(line) for name in ("queries.jsonl", "routing.jsonl") for line in (CODE / name).open()]
    out = Counter()
    for q in queries:
        decision = router.route(q["question"])
        got = decision.entry_id if isinstance(decision, Match) else None
        kind = q["kind"].split("/")[0]
        out[kind, "right" if got == q["expect_entry"] else "wrong graft" if got is not None else "refused"] += 1
    return out


def test_renamed_tasks_graft_and_near_misses_do_not(routers):
    guarded, cosine_only = routers
    got = outcomes(guarded)
    assert got["repeat", "right"] == 26 and got["renamed", "right"] == 26  # renamed, examples dropped
    assert not [k for k in got if k[1] == "wrong graft"], got  # 61 near-misses, 8 uncovered: none grafts
    assert got["near-miss", "right"] == 61 and got["uncovered", "right"] == 8
    # what the guards are for: cosine over the threshold alone grafts every near-miss
    assert outcomes(cosine_only)["near-miss", "wrong graft"] == 61
