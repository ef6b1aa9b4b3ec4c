"""Routing alone (no LLM) on the held-out domains: what kvgraft's router decides for every query.

Each domain's entries are embedded with the library's embedder (MiniLM) into a flat faiss index, the
threshold is the one `kvgraft build` derives from the entries' geometry, and every query goes through the
router with its default guards, exactly as `ask` routes it. Prints, per domain and kind, how many
paraphrases were matched to their entry, how many near-misses and uncovered questions were matched at
all (a wrong graft), and the guards that refused paraphrases.

    .venv/bin/python examples/domains/route_only.py [--json]
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from kvgraft_plugin import Embedder, VectorIndex, read_source
from kvgraft_plugin._index import geometry_threshold
from kvgraft_plugin._router import DEFAULT_GUARDS, Match, Router

HERE = Path(__file__).resolve().parent


def route_domain(embedder: Embedder, folder: Path) -> list[dict[str, object]]:
    """One row per query: its kind, whether it should match, what the router decided and why."""
    entries = {e.id: e for e in read_source(folder / "library.jsonl")}
    index = VectorIndex(embedder.dim, "flat")
    ids = sorted(entries)
    index.add(ids, embedder.encode([entries[i].problem for i in ids]))
    router = Router(
        embedder.encode,
        lambda vector, k: [(h.entry_id, h.score) for h in index.search(vector, k)],
        entries,
        threshold=geometry_threshold(index),
        guards=DEFAULT_GUARDS,
    )
    rows = []
    for line in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        query = json.loads(line)
        decision = router.route(query["question"])
        matched = decision.entry_id if isinstance(decision, Match) else None
        refused = [v for v in decision.trail if not v.passed]
        rows.append(
            {
                "domain": folder.name,
                "id": query["id"],
                "kind": query["kind"].split("/")[0],
                "expect": query["expect_entry"],
                "matched": matched,
                "refused_by": refused[0].guard if refused and matched is None else None,
            }
        )
    return rows


def main() -> None:
    embedder = Embedder()
    rows = [row for folder in sorted(p for p in HERE.iterdir() if p.is_dir()) for row in route_domain(embedder, folder)]
    if "--json" in sys.argv:
        print(json.dumps(rows))
        return
    print(f"{'domain':<10} {'paraphrase right':>17} {'wrong':>6} {'near-miss matched':>18} {'uncovered matched':>18}")
    total: collections.Counter[str] = collections.Counter()
    for domain in sorted({r["domain"] for r in rows}):
        mine = [r for r in rows if r["domain"] == domain]
        para = [r for r in mine if r["kind"] == "paraphrase"]
        right = sum(r["matched"] == r["expect"] for r in para)
        wrong = sum(r["matched"] not in (None, r["expect"]) for r in para)
        near = [r for r in mine if r["kind"] == "near-miss"]
        unc = [r for r in mine if r["kind"] == "uncovered"]
        near_m, unc_m = sum(r["matched"] is not None for r in near), sum(r["matched"] is not None for r in unc)
        total.update(para=len(para), right=right, wrong=wrong, near=len(near), near_m=near_m, unc=len(unc), unc_m=unc_m)
        print(f"{domain:<10} {right:>8}/{len(para):<8} {wrong:>6} {near_m:>9}/{len(near):<8} {unc_m:>9}/{len(unc):<8}")
    print(
        f"{'all':<10} {total['right']:>8}/{total['para']:<8} {total['wrong']:>6} "
        f"{total['near_m']:>9}/{total['near']:<8} {total['unc_m']:>9}/{total['unc']:<8}"
    )
    refusals = collections.Counter(r["refused_by"] for r in rows if r["kind"] == "paraphrase" and r["matched"] is None)
    print("paraphrases refused by:", dict(refusals.most_common()))


if __name__ == "__main__":
    main()
