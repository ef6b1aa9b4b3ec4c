#!/usr/bin/env python3
"""Validate the hand-written routing evaluation set in this folder (stdlib only).

Usage: python3 examples/domains/check.py   (exit status 1 on any problem)
"""

import json
import os
import re
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
DOMAINS = ["physics", "chemistry", "finance", "units", "facts", "code", "german", "russian", "chinese"]
NEAR_MISS_KINDS = ["asked-quantity", "concept", "negation", "operation", "unit", "order", "numbers"]
TOP_KINDS = ["paraphrase", "near-miss", "uncovered"]
ENTRY_KEYS = {"id", "problem", "solution", "answer"}
QUERY_KEYS = {"id", "question", "kind", "expect_entry", "answer"}
SCRIPT = {  # every problem/solution/question in these folders must use the script
    "russian": re.compile(r"[\u0400-\u04FF]"),
    "chinese": re.compile(r"[\u4E00-\u9FFF]"),
}
GERMAN_WORDS = (
    "der die das den dem ein eine einen wie was welche welchen welcher viel viele von mit und ist sind hat um aus "
    "auf man für bei"
)
GERMAN_HINT = re.compile(r"\b(" + "|".join(GERMAN_WORDS.split()) + r")\b", re.I)

errors = []


def err(msg):
    errors.append(msg)


def load_jsonl(path):
    rows = []
    if not os.path.isfile(path):
        err(f"{path}: missing")
        return rows
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                err(f"{path}:{n}: blank line")
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                err(f"{path}:{n}: bad JSON ({e})")
                continue
            if not isinstance(row, dict):
                err(f"{path}:{n}: not an object")
                continue
            rows.append((n, row))
    return rows


def main():
    all_ids = set()
    table = {}
    nm_table = {}
    para_table = {}
    for dom in DOMAINS:
        d = os.path.join(HERE, dom)
        lib_path = os.path.join(d, "library.jsonl")
        q_path = os.path.join(d, "queries.jsonl")
        entries = {}
        problems = set()
        for n, e in load_jsonl(lib_path):
            where = f"{lib_path}:{n}"
            if set(e) != ENTRY_KEYS:
                err(f"{where}: keys {sorted(e)} != {sorted(ENTRY_KEYS)}")
                continue
            if not all(isinstance(e[k], str) and e[k].strip() for k in ENTRY_KEYS):
                err(f"{where}: every field must be a non-empty string")
                continue
            if not e["id"].startswith(dom + "/"):
                err(f"{where}: id {e['id']!r} must start with '{dom}/'")
            if e["id"] in all_ids:
                err(f"{where}: duplicate id {e['id']!r}")
            all_ids.add(e["id"])
            if e["answer"] not in e["solution"]:
                err(f"{where}: answer {e['answer']!r} not found verbatim in solution")
            if e["problem"] in problems:
                err(f"{where}: duplicate problem text")
            problems.add(e["problem"])
            if dom in SCRIPT and not SCRIPT[dom].search(e["problem"] + e["solution"]):
                err(f"{where}: expected {dom} script in problem/solution")
            entries[e["id"]] = e
        if len(entries) != 10:
            err(f"{lib_path}: {len(entries)} entries, expected 10")

        tops = Counter()
        nms = Counter()
        paras = Counter()
        para_refs = Counter()
        questions = set()
        seq = defaultdict(int)
        for n, q in load_jsonl(q_path):
            where = f"{q_path}:{n}"
            if set(q) != QUERY_KEYS:
                err(f"{where}: keys {sorted(q)} != {sorted(QUERY_KEYS)}")
                continue
            if not all(isinstance(q[k], str) and q[k].strip() for k in ("id", "question", "kind")):
                err(f"{where}: id/question/kind must be non-empty strings")
                continue
            if q["answer"] is not None and not (isinstance(q["answer"], str) and q["answer"].strip()):
                err(f"{where}: answer must be a non-empty string or null")
            top, _, sub = q["kind"].partition("/")
            if top not in TOP_KINDS:
                err(f"{where}: unknown kind {q['kind']!r}")
                continue
            if top == "near-miss" and sub not in NEAR_MISS_KINDS:
                err(f"{where}: unknown near-miss kind {sub!r}")
            if top == "paraphrase" and not sub:
                err(f"{where}: paraphrase kind needs a '/how' suffix")
            if top == "uncovered" and sub:
                err(f"{where}: uncovered takes no suffix")
            seq[top] += 1
            want_id = f"{dom}-{top}-{seq[top]}"
            if q["id"] != want_id:
                err(f"{where}: id {q['id']!r}, expected {want_id!r}")
            if q["id"] in all_ids:
                err(f"{where}: duplicate id {q['id']!r}")
            all_ids.add(q["id"])
            if q["question"] in questions:
                err(f"{where}: duplicate question text")
            questions.add(q["question"])
            if q["question"] in problems:
                err(f"{where}: question is identical to a library problem")
            if dom in SCRIPT and not SCRIPT[dom].search(q["question"]):
                err(f"{where}: expected {dom} script in question")
            if dom == "german" and not GERMAN_HINT.search(q["question"]):
                err(f"{where}: question does not look German")
            exp = q["expect_entry"]
            if top == "paraphrase":
                if exp not in entries:
                    err(f"{where}: expect_entry {exp!r} is not an entry of {dom}")
                else:
                    para_refs[exp] += 1
                    if q["answer"] != entries[exp]["answer"]:
                        err(f"{where}: paraphrase answer differs from the entry's answer")
                paras[sub] += 1
            elif exp is not None:
                err(f"{where}: {top} must have expect_entry null")
            if top == "near-miss":
                nms[sub] += 1
            tops[top] += 1
        for eid in entries:
            if para_refs[eid] < 2:
                err(f"{q_path}: entry {eid} has {para_refs[eid]} paraphrases, expected >= 2")
        for k in NEAR_MISS_KINDS:
            if nms[k] == 0:
                err(f"{q_path}: no near-miss of kind {k!r}")
        if not 2 * len(entries) <= tops["near-miss"] <= 3 * len(entries):
            err(f"{q_path}: {tops['near-miss']} near-misses, expected 2-3 per entry")
        if tops["uncovered"] != 4:
            err(f"{q_path}: {tops['uncovered']} uncovered, expected 4")
        table[dom] = (len(entries), tops["paraphrase"], tops["near-miss"], tops["uncovered"], sum(tops.values()))
        nm_table[dom] = nms
        para_table[dom] = paras

    cols = ["entries", "paraphrase", "near-miss", "uncovered", "queries"]
    print(f"{'domain':<10}" + "".join(f"{c:>11}" for c in cols))
    tot = [0] * len(cols)
    for dom in DOMAINS:
        row = table.get(dom, (0,) * len(cols))
        tot = [a + b for a, b in zip(tot, row)]
        print(f"{dom:<10}" + "".join(f"{v:>11}" for v in row))
    print(f"{'TOTAL':<10}" + "".join(f"{v:>11}" for v in tot))
    print()
    short = {
        "asked-quantity": "asked",
        "concept": "concept",
        "negation": "negat",
        "operation": "oper",
        "unit": "unit",
        "order": "order",
        "numbers": "numbers",
    }
    print("near-miss kinds")
    print(f"{'domain':<10}" + "".join(f"{short[k]:>9}" for k in NEAR_MISS_KINDS))
    nm_tot = Counter()
    for dom in DOMAINS:
        c = nm_table.get(dom, Counter())
        nm_tot.update(c)
        print(f"{dom:<10}" + "".join(f"{c[k]:>9}" for k in NEAR_MISS_KINDS))
    print(f"{'TOTAL':<10}" + "".join(f"{nm_tot[k]:>9}" for k in NEAR_MISS_KINDS))
    print()
    p_tot = Counter()
    for c in para_table.values():
        p_tot.update(c)
    print("paraphrase kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(p_tot.items())))

    if errors:
        print(f"\n{len(errors)} problem(s):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1
    print("\nOK: all files valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
