#!/usr/bin/env python3
"""Sanity checks for examples/related/<set>/{library,queries}.jsonl."""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = ["physics", "chemistry", "finance", "geometry", "french", "spanish"]
KINDS = {"paraphrase", "near-miss/numbers", "near-miss/asked"}
errors = []


def err(msg):
    errors.append(msg)


def load(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    err(f"{path}:{i}: bad JSON: {e}")
    return rows


def answer_value(answer):
    """The number an answer string states ("12.5 m/s", "$135", "10.55 €"), as build.py asserted it."""
    match = re.search(r"-?\d+(?:\.\d+)?", answer.replace(",", "."))  # French and Spanish: a decimal comma
    return round(float(match.group()), 2) if match else None


def isnum(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


ids = set()
totals = {"entries": 0, **{k: 0 for k in KINDS}}
for s in SETS:
    lib = load(os.path.join(HERE, s, "library.jsonl"))
    qs = load(os.path.join(HERE, s, "queries.jsonl"))
    entries = {}
    for e in lib:
        if set(e) != {"id", "problem", "solution", "answer"}:
            err(f"{s}: entry keys {sorted(e)}")
        if not str(e.get("id", "")).startswith(s + "/"):
            err(f"{s}: entry id {e.get('id')} lacks prefix")
        for k in ("problem", "solution", "answer"):
            if not isinstance(e.get(k), str) or not e.get(k).strip():
                err(f"{e.get('id')}: empty {k}")
        e["value"] = answer_value(e.get("answer", ""))  # a library source has no value field: its answer's number
        if not isnum(e.get("value")):
            err(f"{e.get('id')}: value not a number")
        if e.get("id") in ids:
            err(f"duplicate id {e.get('id')}")
        ids.add(e.get("id"))
        entries[e.get("id")] = e
    counts = {k: 0 for k in KINDS}
    for q in qs:
        qid = q.get("id")
        if set(q) != {"id", "question", "kind", "expect_entry", "near_entry", "answer", "value"}:
            err(f"{qid}: keys {sorted(q)}")
        if qid in ids:
            err(f"duplicate id {qid}")
        ids.add(qid)
        k = q.get("kind")
        if k not in KINDS:
            err(f"{qid}: bad kind {k}")
            continue
        counts[k] += 1
        if not str(qid).startswith(f"{s}-{k.replace('/', '-')}-"):
            err(f"{qid}: id does not match <set>-<kind>-<n>")
        if not isinstance(q.get("question"), str) or not q["question"].strip():
            err(f"{qid}: empty question")
        if not isinstance(q.get("answer"), str) or not q["answer"].strip():
            err(f"{qid}: empty answer")
        if not isnum(q.get("value")):
            err(f"{qid}: value not a number")
        ne = q.get("near_entry")
        if ne not in entries:
            err(f"{qid}: near_entry {ne} not in {s} library")
            continue
        if k == "paraphrase":
            if q.get("expect_entry") != ne:
                err(f"{qid}: paraphrase expect_entry {q.get('expect_entry')} != near_entry {ne}")
            if q.get("value") != entries[ne]["value"]:
                err(f"{qid}: paraphrase value {q.get('value')} != entry value {entries[ne]['value']}")
        else:
            if q.get("expect_entry") is not None:
                err(f"{qid}: near-miss must have expect_entry null")
            if q.get("value") == entries[ne]["value"]:
                err(f"{qid}: near-miss value equals its entry's value {q.get('value')}")
    per_entry = {}
    for q in qs:
        per_entry.setdefault(q.get("near_entry"), []).append(q.get("kind"))
    for eid in entries:
        ks = sorted(per_entry.get(eid, []))
        if ks != sorted(["paraphrase", "near-miss/numbers", "near-miss/asked"]):
            err(f"{eid}: query kinds {ks}")
    print(f"{s:10s} entries={len(lib)} queries={len(qs)} " + " ".join(f"{k}={counts[k]}" for k in sorted(KINDS)))
    totals["entries"] += len(lib)
    for k in KINDS:
        totals[k] += counts[k]

print("TOTAL      " + " ".join(f"{k}={v}" for k, v in totals.items()))
if errors:
    print(f"{len(errors)} error(s):")
    for e in errors:
        print("  " + e)
    sys.exit(1)
print("OK")
