#!/usr/bin/env python3
"""Validate the judge-dev tuning set (stdlib only). Usage: python3 examples/judge-dev/check.py"""

import json
import os
import re
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
DOMAINS = ["geometry", "biology-stats", "french", "japanese", "spanish"]
NM = {"asked-quantity", "concept", "negation", "operation", "unit", "order", "numbers"}
PARA = {"new-words", "reordered", "formal", "casual"}
JA = re.compile(r"[\u3040-\u30FF\u4E00-\u9FFF]")
errors = []
ids = set()
print("| domain | entries | paraphrase | near-miss | uncovered | queries |")
print("|---|---|---|---|---|---|")
tot = Counter()
for dom in DOMAINS:
    lib = [json.loads(line) for line in open(os.path.join(HERE, dom, "library.jsonl"), encoding="utf-8")]
    qs = [json.loads(line) for line in open(os.path.join(HERE, dom, "queries.jsonl"), encoding="utf-8")]
    ent = {}
    for e in lib:
        if set(e) != {"id", "problem", "solution", "answer"}:
            errors.append(f"{dom}: keys {e}")
        if not e["id"].startswith(dom + "/"):
            errors.append(f"bad id {e['id']}")
        if e["id"] in ids:
            errors.append(f"dup {e['id']}")
        ids.add(e["id"])
        ent[e["id"]] = e
        if e["answer"] not in e["solution"]:
            errors.append(f"{e['id']}: answer not in solution")
    c = Counter()
    nmk = Counter()
    per = Counter()
    for q in qs:
        if set(q) != {"id", "question", "kind", "expect_entry", "answer"}:
            errors.append(f"{dom}: keys {q}")
        top, _, sub = q["kind"].partition("/")
        c[top] += 1
        if q["id"] != f"{dom}-{top}-{c[top]}":
            errors.append(f"bad query id {q['id']}")
        if q["id"] in ids:
            errors.append(f"dup {q['id']}")
        ids.add(q["id"])
        if top == "paraphrase":
            if sub not in PARA:
                errors.append(f"{q['id']}: kind")
            e = ent.get(q["expect_entry"])
            if e is None:
                errors.append(f"{q['id']}: expect_entry {q['expect_entry']} missing")
            elif q["answer"] != e["answer"]:
                errors.append(f"{q['id']}: answer != entry")
            else:
                per[e["id"]] += 1
        elif top == "near-miss":
            if sub not in NM:
                errors.append(f"{q['id']}: kind")
            nmk[sub] += 1
            if q["expect_entry"] is not None or not q["answer"]:
                errors.append(f"{q['id']}: near-miss fields")
        elif top == "uncovered":
            if q["expect_entry"] is not None:
                errors.append(f"{q['id']}: uncovered expect_entry")
        else:
            errors.append(f"{q['id']}: kind {q['kind']}")
        if dom == "japanese" and not JA.search(q["question"]):
            errors.append(f"{q['id']}: not Japanese")
    if dom == "japanese":
        for e in lib:
            if not (JA.search(e["problem"]) and JA.search(e["solution"])):
                errors.append(f"{e['id']}: not Japanese")
    if len(lib) != 6 or c["paraphrase"] != 12 or c["near-miss"] != 12 or c["uncovered"] != 2:
        errors.append(f"{dom}: counts {len(lib)} {dict(c)}")
    if any(per[i] != 2 for i in ent):
        errors.append(f"{dom}: paraphrases per entry {dict(per)}")
    if set(nmk) != NM:
        errors.append(f"{dom}: near-miss kinds missing {NM - set(nmk)}")
    print(f"| {dom} | {len(lib)} | {c['paraphrase']} | {c['near-miss']} | {c['uncovered']} | {len(qs)} |")
    tot.update(entries=len(lib), queries=len(qs), **c)
print(
    f"| total | {tot['entries']} | {tot['paraphrase']} | {tot['near-miss']} | {tot['uncovered']} | {tot['queries']} |"
)
for e in errors:
    print("ERROR:", e)
sys.exit(1 if errors else 0)
