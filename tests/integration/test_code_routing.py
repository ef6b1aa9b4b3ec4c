"""Routing on the code library with the real MiniLM and a real faiss index (no LLM is needed to route), on the
set the code key words were tuned on and on the hand-written held-out set: no near-miss or uncovered task
grafts, renamed and reworded tasks do, and the guards are what refuses the near-misses (cosine alone grafts
them)."""

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


def outcomes(router, *names):
    """(kind, outcome) counts over the query files ``names``: ``right``, ``wrong graft`` or ``refused``."""
    queries = [json.loads(line) for name in names for line in (CODE / name).open()]
    out = Counter()
    for q in queries:
        decision = router.route(q["question"])
        got = decision.entry_id if isinstance(decision, Match) else None
        kind = q["kind"].split("/")[0]
        out[kind, "right" if got == q["expect_entry"] else "wrong graft" if got is not None else "refused"] += 1
    return out


@pytest.mark.parametrize("names", [("queries.jsonl", "routing.jsonl"), ("heldout.jsonl",)], ids=["tuning", "heldout"])
def test_no_near_miss_or_uncovered_task_grafts(routers, names):
    """Precision, on the set the code key words were tuned on and on the hand-written held-out set alike:
    nothing grafts onto the wrong entry. Recall is printed, not asserted: on the held-out set's reworded
    tasks the word guards alone graft none (the judge is what approves them, off the request's path)."""
    guarded, _ = routers
    got = outcomes(guarded, *names)
    assert not [k for k in got if k[1] == "wrong graft"], got
    reworded = sum(n for (kind, how), n in got.items() if kind in ("renamed", "reworded") and how == "right")
    asked = sum(n for (kind, _), n in got.items() if kind in ("renamed", "reworded"))
    print(f"{names}: renamed or reworded tasks grafted {reworded}/{asked}; {dict(got)}")


def test_every_entrys_own_task_grafts_onto_it(routers):
    """A router that refuses everything is precise and useless: each entry's own text is an exact repeat."""
    guarded, _ = routers
    entries = read_source(CODE / "library.jsonl")
    routed = {e.id: getattr(guarded.route(e.problem), "entry_id", None) for e in entries}
    assert routed == {e.id: e.id for e in entries}


def test_the_guards_are_what_refuses_the_near_misses(routers):
    """Cosine over the threshold alone grafts near-misses the guards refuse, on the held-out set too."""
    guarded, cosine_only = routers
    for names in (("routing.jsonl",), ("heldout.jsonl",)):
        cosine, guards = (outcomes(router, *names)["near-miss", "wrong graft"] for router in (cosine_only, guarded))
        assert cosine > guards, (names, cosine, guards)
