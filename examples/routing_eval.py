"""Routing alone, on labelled query sets: the word guards, the judge, and both, per set and kind.

Each set is a library source and its labelled queries (`expect_entry`: an entry id, or null). Its entries are
embedded with the library's embedder (MiniLM) into a flat faiss index, the similarity threshold is the one
`kvgraft build` derives from the entries' geometry, and every query goes through `Router` as `ask` routes it:

- `words`: the default guards, no judge (what a library without a judge does);
- `judge`: the structural guards (`JUDGED_GUARDS`) and the judge;
- `profile`: the default guards, then the judge as a veto at `VETO_THRESHOLD` (``profile="math"``).

The judge's margins are computed once per (entry, question), down to the lowest threshold asked (its views stop
at the first margin below it), with the rewording score of a small edit (`kvgraft_plugin.routing.rewording`) and the
reading of numbers written in words (`kvgraft_plugin.routing.numerals`), and saved (``--margins``), so that
thresholds at or above that floor can be compared offline (``--thresholds``); the decisions printed are the
real `Router`'s.

``--replay`` asks every query twice in a shuffled stream, as the default route does (``judge_mode="async"``, the
real `DeferredJudge` and aliases): on first sight the word guards decide and the pair is queued, the idle judge
reads the queue, and an approval is an alias on the second asking. It prints, per set, the paraphrases grafted
right and the near-misses and uncovered questions grafted on each asking.

    .venv/bin/python examples/routing_eval.py --judge qwen2.5-coder-1.5b-instruct --margins m.json domains
    .venv/bin/python examples/routing_eval.py --margins m.json --thresholds 0,1,2 domains   # no model run

Sets: ``domains`` (examples/domains/*), ``domains-b`` (examples/domains-b/*), ``dev`` (examples/judge-dev/*),
``math`` (examples/library.jsonl with examples/routing/*.jsonl), ``code`` (examples/code/library.jsonl with its
routing and heldout queries), or a folder holding library.jsonl and queries.jsonl.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kvgraft_plugin import Embedder, VectorIndex, read_source  # noqa: E402
from kvgraft_plugin.library.aliases import DeferredJudge  # noqa: E402
from kvgraft_plugin.library.index import geometry_threshold  # noqa: E402
from kvgraft_plugin.routing.judge import SMALL_EDIT, VETO_THRESHOLD, JudgeVerdict, pair_bar  # noqa: E402
from kvgraft_plugin.routing.numerals import written_numbers  # noqa: E402
from kvgraft_plugin.routing.router import DEFAULT_GUARDS, JUDGED_GUARDS, Match, Router  # noqa: E402

MODES = ("words", "judge", "profile")
WITHOUT: set[str] = set()  # word guards left out (--without), for an ablation


def sets(names: list[str]) -> list[tuple[str, Path, list[Path]]]:
    """(name, library source, query files) for each named set."""
    out: list[tuple[str, Path, list[Path]]] = []
    for name in names:
        if name in ("domains", "domains-b", "dev"):
            root = HERE / ("judge-dev" if name == "dev" else name)
            out += [(f"{name}/{d.name}", d / "library.jsonl", [d / "queries.jsonl"]) for d in sorted(root.iterdir())
                    if (d / "queries.jsonl").is_file()]  # fmt: skip
        elif name == "math":
            routing = HERE / "routing"
            out += [(f"math/{q.stem}", HERE / "library.jsonl", [q]) for q in sorted(routing.glob("*.jsonl"))]
        elif name == "code":
            code = HERE / "code"
            out += [(f"code/{q}", code / "library.jsonl", [code / f"{q}.jsonl"]) for q in ("routing", "heldout")]
        else:
            folder = Path(name)
            out.append(
                (f"{folder.resolve().parent.name}/{folder.name}", folder / "library.jsonl", [folder / "queries.jsonl"])
            )
    return out


class RecordingJudge:
    """Margins (and rewording scores) from a saved table, computed by ``judge`` (a `Judge`) when absent;
    ``threshold`` decides. A margin is computed down to ``floor``: the views stop at the first one below it,
    so the table decides every threshold at or above ``floor`` as the real judge would."""

    def __init__(self, margins: dict[str, Any], judge: Any | None, floor: float = float("-inf")) -> None:
        self.margins, self.judge, self.threshold, self.floor = margins, judge, 0.0, floor
        self.ms: list[float] = []

    def __call__(self, entry: Any, question: str, score: float) -> JudgeVerdict:
        margin = self.margin(entry, question)
        threshold, why = pair_bar(entry.problem, question, self.threshold)
        rewording, numerals = None, None
        if written_numbers(entry.problem, question):
            numerals = self.numerals(entry, question)
        if not numerals and why == SMALL_EDIT and margin >= self.threshold:
            rewording = self.rewording(entry, question)
        return JudgeVerdict(
            margin, threshold, 0.0, cached=True, clear_yes=why, rewording=rewording, numerals=numerals
        )  # fmt: skip

    def vetoing(self, entry: Any, question: str, score: float) -> JudgeVerdict:
        """Behind the word guards (``profile``): a veto at ``VETO_THRESHOLD``, no clear Yes needed."""
        numerals = self.numerals(entry, question) if written_numbers(entry.problem, question) else None
        return JudgeVerdict(self.margin(entry, question), VETO_THRESHOLD, 0.0, cached=True, numerals=numerals)

    def margin(self, entry: Any, question: str) -> float:
        return float(self._record(entry, question)["margin"])

    def rewording(self, entry: Any, question: str) -> float:
        return float(self._scored(entry, question, "rewording"))

    def numerals(self, entry: Any, question: str) -> bool:
        return bool(self._scored(entry, question, "numerals"))

    def _scored(self, entry: Any, question: str, name: str) -> Any:
        """The pair's recorded ``name`` (a score beyond its margin), computed by the judge's method of that name
        when absent."""
        record = self._record(entry, question)
        if record.get(name) is None:
            if self.judge is None:
                raise SystemExit(f"a {name} score is missing from --margins and no --judge is given")
            t0 = time.perf_counter()
            record[name] = getattr(self.judge, name)(entry.problem, question)
            self.ms.append((time.perf_counter() - t0) * 1e3)
        return record[name]

    def _record(self, entry: Any, question: str) -> dict[str, Any]:
        key = json.dumps([entry.problem, question], ensure_ascii=False)
        if isinstance(self.margins.get(key), float):  # a table from before rewording scores: every view
            self.margins[key] = {"margin": self.margins[key], "floor": float("-inf")}
        record = self.margins.get(key)
        if record is not None and self.floor < record["floor"] and record["margin"] < record["floor"]:
            del self.margins[key]  # computed down to a higher floor than this run needs
        if key not in self.margins:
            if self.judge is None:
                raise SystemExit("a margin is missing from --margins and no --judge is given")
            margins = []
            t0 = time.perf_counter()
            for view in range(len(self.judge.views)):
                margins.append(self.judge.view_margin(view, entry.problem, question, entry.answer))
                if margins[-1] < self.floor:
                    break
            self.ms.append((time.perf_counter() - t0) * 1e3)
            self.margins[key] = {"margin": min(margins), "floor": self.floor}
        return self.margins[key]


def route_set(embedder: Embedder, source: Path, queries: list[Path], judge: RecordingJudge | None,
              floor: float | None, modes: tuple[str, ...] = MODES) -> list[dict[str, Any]]:  # fmt: skip
    """One row per query: its kind, what it should match, and each mode's decision."""
    entries = {e.id: e for e in read_source(source)}
    index = VectorIndex(embedder.dim, "flat")
    ids = sorted(entries)
    index.add(ids, embedder.encode([entries[i].problem for i in ids]))
    threshold = geometry_threshold(index)

    def router(mode: str) -> Router:
        return Router(
            embedder.encode,
            lambda vector, k: [(h.entry_id, h.score) for h in index.search(vector, k)],
            entries,
            threshold=threshold if mode == "words" or floor is None else min(threshold, floor),
            guards=JUDGED_GUARDS if mode == "judge" else tuple(g for g in DEFAULT_GUARDS if g[0] not in WITHOUT),
            judge=None if mode == "words" or judge is None else judge.vetoing if mode == "profile" else judge,
        )

    routers = {mode: router(mode) for mode in (modes if judge is not None else ("words",))}
    rows = []
    for entry_id in ids:  # exact repeats: every entry's own problem
        row: dict[str, Any] = {"id": f"repeat:{entry_id}", "kind": "repeat", "expect": entry_id}
        for mode, r in routers.items():
            decision = r.route(entries[entry_id].problem)
            row[mode] = decision.entry_id if isinstance(decision, Match) else None
        rows.append(row)
    for path in queries:
        for line in path.read_text(encoding="utf-8").splitlines():
            query = json.loads(line)
            row = {"id": query["id"], "kind": query.get("kind") or "?", "expect": query.get("expect_entry")}
            for mode, r in routers.items():
                t0 = time.perf_counter()
                decision = r.route(query["question"])
                row[f"{mode}_ms"] = (time.perf_counter() - t0) * 1e3  # embed + search + decision
                row[mode] = decision.entry_id if isinstance(decision, Match) else None
                refused = [v for v in decision.trail if not v.passed]
                row[f"{mode}_refused_by"] = refused[0].guard if refused and row[mode] is None else None
            rows.append(row)
    return rows


class ReplayJudge:
    """``recording``'s margins as a `Judge` that knows only the pairs judged so far in this replay."""

    model_id = "recorded"

    def __init__(self, recording: RecordingJudge) -> None:
        self.recording, self.seen = recording, set()

    def known(
        self, problem: str, question: str, answer: str | None, threshold: float, *, vouched: bool = False
    ) -> JudgeVerdict | None:
        key = json.dumps([problem, question], ensure_ascii=False)
        if key not in self.seen:
            return None
        entry = type("E", (), {"problem": problem, "answer": answer})()
        return self.recording(entry, question, 0.0)

    def __call__(
        self, problem: str, question: str, *, answer: str | None, threshold: float, vouched: bool = False
    ) -> JudgeVerdict:
        self.seen.add(json.dumps([problem, question], ensure_ascii=False))
        entry = type("E", (), {"problem": problem, "answer": answer})()
        return self.recording(entry, question, 0.0)  # as `known` will read it: with its rewording and numerals


def replay(embedder: Embedder, named: list[tuple[str, Path, list[Path]]], recording: RecordingJudge,
           seed: int = 0) -> list[str]:  # fmt: skip
    """The default route, ``judge_mode="async"``, over a stream of every query in a shuffled order: asked once
    (first sight: the word guards decide, the pair is queued), the idle judge reads every queued pair (an
    approval is an alias), then every query is asked again. Per set: paraphrases right and near-misses grafted
    on first sight and on the second asking, and the judge's time per pair it read."""
    import random

    routers: dict[str, Router] = {}
    stream: list[tuple[str, dict[str, Any]]] = []
    for name, source, queries in named:
        entries = {e.id: e for e in read_source(source)}
        index = VectorIndex(embedder.dim, "flat")
        ids = sorted(entries)
        index.add(ids, embedder.encode([entries[i].problem for i in ids]))
        deferred = DeferredJudge(ReplayJudge(recording), recording.threshold)
        routers[name] = Router(
            embedder.encode, lambda vector, k, index=index: [(h.entry_id, h.score) for h in index.search(vector, k)],
            entries, threshold=geometry_threshold(index), guards=JUDGED_GUARDS, judge=deferred, aliases={},
            judge_threshold=recording.threshold, first_sight=DEFAULT_GUARDS,
        )  # fmt: skip
        routers[name].deferred = deferred  # type: ignore[attr-defined]
        for path in queries:
            stream += [(name, json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]
    random.Random(seed).shuffle(stream)
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for asking in ("first", "again"):
        for name, query in stream:
            decision = routers[name].route(query["question"])
            got = decision.entry_id if isinstance(decision, Match) else None
            kind = "para" if query.get("expect_entry") else "near" if query["kind"].startswith("near") else "unc"
            hit = got is not None and got == query.get("expect_entry") if kind == "para" else got is not None
            for c in (counts[name], counts["all"]):
                c[f"{asking}_{kind}"] += 1
                c[f"{asking}_{kind}_hit"] += hit
        if asking == "first":  # the idle judge reads every queued pair
            for name, router in routers.items():
                deferred: DeferredJudge = router.deferred  # type: ignore[attr-defined]
                while deferred.pending:
                    alias = deferred.judge_next(model="recorded", prompt="-", entry_sha256=lambda e: "")
                    if alias is not None:
                        router.aliases[alias.key] = alias  # type: ignore[index]
                        counts[name]["aliases"] += 1
                        counts["all"]["aliases"] += 1
    lines = [f"replay ({len(stream)} queries, async judge at {recording.threshold:+g}): paraphrases right / "
             "near-misses grafted / uncovered grafted, first sight then asked again"]  # fmt: skip
    for name, c in counts.items():
        first, again = (_cell(c, asking) for asking in ("first", "again"))
        lines.append(f"  {name:<24} first {first:<22} again {again:<22} aliases {c['aliases']}")
    return lines


def _cell(c: collections.Counter[str], asking: str) -> str:
    return " ".join(f"{c[f'{asking}_{kind}_hit']}/{c[f'{asking}_{kind}']}" for kind in ("para", "near", "unc"))


def table(results: dict[str, list[dict[str, Any]]], mode: str) -> list[str]:
    """Per set: paraphrases (or repeats) right, wrong grafts, near-misses and uncovered matched."""
    lines = [
        f"{'set':<24} {'covered right':>14} {'wrong':>6} {'near-miss grafted':>18} {'uncovered grafted':>18}"
        f" {'repeats':>9}"
    ]
    total: collections.Counter[str] = collections.Counter()
    for name, rows in results.items():
        repeats = [r for r in rows if r["kind"] == "repeat"]
        rows = [r for r in rows if r["kind"] != "repeat"]
        covered = [r for r in rows if r["expect"] is not None]
        near = [r for r in rows if r["expect"] is None and not r["kind"].startswith("uncovered")]
        unc = [r for r in rows if r["expect"] is None and r["kind"].startswith("uncovered")]
        c = collections.Counter(
            cov=len(covered), right=sum(r[mode] == r["expect"] for r in covered),
            wrong=sum(r[mode] not in (None, r["expect"]) for r in rows), near=len(near),
            near_m=sum(r[mode] is not None for r in near), unc=len(unc), unc_m=sum(r[mode] is not None for r in unc),
            rep=len(repeats), rep_ok=sum(r[mode] == r["expect"] for r in repeats),
        )  # fmt: skip
        total.update(c)
        lines.append(_line(name, c))
    lines.append(_line("all", total))
    return lines


def _line(name: str, c: collections.Counter[str]) -> str:
    pct = f"({100 * c['right'] / c['cov']:.0f}%)" if c["cov"] else ""
    return (
        f"{name:<24} {c['right']:>5}/{c['cov']:<4}{pct:>5} {c['wrong']:>6} {c['near_m']:>9}/{c['near']:<8} "
        f"{c['unc_m']:>9}/{c['unc']:<8} {c['rep_ok']:>4}/{c['rep']:<4}"
    )


def by_kind(results: dict[str, list[dict[str, Any]]], mode: str) -> list[str]:
    """Grafted / total per kind (paraphrases: onto the right entry)."""
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for rows in results.values():
        for r in rows:
            ok = r[mode] == r["expect"] if r["expect"] is not None else r[mode] is not None
            counts[r["kind"]][0] += ok
            counts[r["kind"]][1] += 1
    return [f"  {kind:<28} {k}/{n}" for kind, (k, n) in sorted(counts.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sets", nargs="+")
    parser.add_argument("--judge", help="judge model (name or GGUF path); without it, margins come from --margins")
    parser.add_argument("--margins", type=Path, help="JSON file of judge margins, read and extended")
    parser.add_argument("--thresholds", default="0", help="judge margin thresholds to report, comma-separated")
    parser.add_argument("--floor", type=float, help="similarity floor with a judge (default: the library's threshold)")
    parser.add_argument("--kinds", action="store_true", help="also print per kind")
    parser.add_argument("--modes", default=",".join(MODES), help="modes to run, comma-separated")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--replay", action="store_true", help="ask every query twice, the judge deferred between")
    parser.add_argument("--without", default="", help="word guards to leave out, comma-separated (an ablation)")
    args = parser.parse_args()
    WITHOUT.update(g for g in args.without.split(",") if g)

    margins: dict[str, Any] = {}
    if args.margins is not None and args.margins.is_file():
        margins = json.loads(args.margins.read_text())
    judge = None
    if args.judge is not None:
        from kvgraft_plugin.routing.judge import open_judge

        judge = open_judge(args.judge)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    modes = tuple(m for m in args.modes.split(",") if m in MODES)
    floor = min(thresholds + ([VETO_THRESHOLD] if "profile" in modes else []))
    recording = RecordingJudge(margins, judge, floor) if (judge is not None or margins) else None
    embedder = Embedder()
    t0 = time.perf_counter()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for t in thresholds:
        if recording is not None:
            recording.threshold = t
        results[str(t)] = {}
        for name, src, qs in sets(args.sets):
            results[str(t)][name] = route_set(embedder, src, qs, recording, args.floor, modes)
            if args.margins is not None and margins:  # after each set: an interrupted run keeps what it judged
                args.margins.write_text(json.dumps(margins, ensure_ascii=False, indent=0))
    elapsed = time.perf_counter() - t0
    for mode in modes if recording is not None else ("words",):
        for t in thresholds if mode != "words" else thresholds[:1]:
            label = {"words": "", "judge": f", judge threshold {t:+g}", "profile": f", veto below {VETO_THRESHOLD:+g}"}
            print(f"\n== {mode}{label[mode]}")
            print("\n".join(table(results[str(t)], mode)))
            if args.kinds:
                print("\n".join(by_kind(results[str(t)], mode)))
            ms = sorted(r[f"{mode}_ms"] for rows in results[str(t)].values() for r in rows if f"{mode}_ms" in r)
            if ms and mode == "words":
                p50, p95 = ms[len(ms) // 2], ms[int(len(ms) * 0.95)]
                print(f"routing before the first token: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {ms[-1]:.1f} ms")
    if args.replay and recording is not None:
        recording.threshold = thresholds[0]
        print("\n".join(replay(embedder, sets(args.sets), recording)))
    if recording is not None and recording.ms:
        ms = sorted(recording.ms)
        print(f"\njudge: {len(ms)} new margins, median {ms[len(ms) // 2]:.0f} ms, total {sum(ms) / 1e3:.0f} s")
    print(f"({elapsed:.0f} s)", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
