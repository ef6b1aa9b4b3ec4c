"""The related route against plain decoding and against its text RAG twin, on the held-out sets of this folder.

For every query of every set, in turn on the same engine (so the timings are ratios within one run):
- ``related``: the nearest entry's state restored, the question asked as a new problem (`mode="related"`);
- its twin: the same prompt prefilled as text (`mode="text-rag", cue="related"`), one token, for its TTFT;
- ``plain``: the question alone, as the library's format asks it.
An answer is right when its final number is the query's ``value``, and copied when it is wrong and is the
nearest entry's value instead.

    .venv/bin/kvgraft build examples/related/physics/library.jsonl --library /tmp/rel/physics \\
        --model qwen2.5-coder-1.5b-instruct --template chat          # once per set
    .venv/bin/python examples/related/measure.py --libraries /tmp/rel --model qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from kvgraft_plugin import GraftEngine
from kvgraft_plugin.curation.answer_checks import final_number, same_value
from kvgraft_plugin.library.library import read_queries

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libraries", type=Path, required=True, help="a folder with one built library per set")
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--kinds", default="near-miss,paraphrase", help="query kinds, by prefix")
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    parser.add_argument("--rescore", type=Path, help="score the answers saved in this results file again; no model")
    args = parser.parse_args()
    if args.rescore:
        rows = rescore(json.loads(args.rescore.read_text()))
        args.rescore.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
        print(report(rows))
        return
    kinds = tuple(args.kinds.split(","))
    rows = []
    for lib in sorted(p for p in args.libraries.iterdir() if (p / "manifest.json").is_file()):
        queries = [q for q in read_queries(HERE / lib.name / "queries.jsonl") if q["kind"].startswith(kinds)]
        with GraftEngine(lib, model_path=args.model, n_threads=2) as engine:
            values = {e: r.entry for e, r in engine.library.entries.items()}
            entry_values = {e: final_number(entry.answer or "") for e, entry in values.items()}
            for q in queries:
                related = engine.ask(q["question"], mode="related", max_tokens=args.max_tokens)
                twin = engine.ask(q["question"], mode="text-rag", cue="related", entry_id=related.entry_id,
                                  max_tokens=1) if related.entry_id else None  # fmt: skip
                plain = engine.ask(q["question"], mode="plain", max_tokens=args.max_tokens)
                theirs = entry_values.get(q["near_entry"])
                row = {"set": lib.name, "id": q["id"], "kind": q["kind"], "value": q["value"],
                       "related_route": related.route, "related_entry": related.entry_id,
                       "right_entry": related.entry_id == q["near_entry"]}  # fmt: skip
                for name, result in (("related", related), ("plain", plain)):
                    got = final_number(result.text)
                    right = same_value(got, q["value"])
                    copied = not right and theirs is not None and same_value(got, theirs)
                    row[name] = {"right": right, "copied": copied, "got": got, "ttft_ms": result.ttft_ms,
                                 "text": result.text}  # fmt: skip
                row["twin_ttft_ms"] = twin.ttft_ms if twin is not None else None
                rows.append(row)
                print(
                    json.dumps(
                        {k: row[k] for k in ("id", "related_route")}
                        | {m: (row[m]["right"], row[m]["copied"], row[m]["got"]) for m in ("related", "plain")}
                    ),
                    flush=True,
                )
    args.out.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    print(report(rows))


def rescore(rows: list[dict]) -> list[dict]:
    """``rows`` with each saved answer read again (`final_number`, `same_value`), as `main` scores them."""
    answers = {}
    for path in HERE.glob("*/library.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            answers[entry["id"]] = final_number(entry["answer"])
    near = {q["id"]: q["near_entry"] for path in HERE.glob("*/queries.jsonl") for q in read_queries(path)}
    for row in rows:
        theirs = answers[near[row["id"]]]
        for name in ("related", "plain"):
            got = final_number(row[name]["text"])
            right = same_value(got, row["value"])
            copied = not right and theirs is not None and same_value(got, theirs)
            row[name].update(got=got, right=right, copied=copied)
    return rows


def report(rows: list[dict]) -> str:
    """Right and copied per set and kind, and the TTFT medians and ratios."""
    lines = ["| set | kind | asked | plain right | related right | plain copied | related copied |", "|" + "---|" * 7]
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        kind = "near-miss" if row["kind"].startswith("near-miss") else "paraphrase"
        groups.setdefault((row["set"], kind), []).append(row)
        groups.setdefault(("all", kind), []).append(row)
    for (name, kind), group in sorted(groups.items(), key=lambda g: (g[0][0] == "all", g[0])):
        counts = [sum(r[m][what] for r in group) for what in ("right", "copied") for m in ("plain", "related")]
        lines.append(f"| {name} | {kind} | {len(group)} | " + " | ".join(map(str, counts)) + " |")
    timed = [r for r in rows if r["twin_ttft_ms"] is not None and r["related_route"] == "related"]
    if timed:
        ratio = statistics.median(r["twin_ttft_ms"] / r["related"]["ttft_ms"] for r in timed)
        lines += [
            "",
            f"TTFT medians over {len(timed)} related answers: related "
            f"{statistics.median(r['related']['ttft_ms'] for r in timed):.0f} ms, its text RAG twin "
            f"{statistics.median(r['twin_ttft_ms'] for r in timed):.0f} ms, plain "
            f"{statistics.median(r['plain']['ttft_ms'] for r in timed):.0f} ms; twin/related per query, median "
            f"{ratio:.2f}x",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
