#!/usr/bin/env python3
"""Validate the `moves` routing set (stdlib only).

Usage: python3 examples/moves/check.py   (exits 1 on any problem)
"""

import collections
import json
import os
import re
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
DOMAINS = ["english-shopping", "english-science", "german", "spanish", "russian"]
N_ENTRIES = 6
N_QUERIES = 25
LIB_KEYS = {"id", "problem", "solution", "answer"}
Q_KEYS = {"id", "question", "kind", "expect_entry", "answer"}
PARA, NEAR, UNC = "paraphrase/moved", "near-miss/order", "uncovered"
BLOCK = [PARA, PARA, NEAR, NEAR]

errors = []


def err(msg):
    errors.append(msg)


def digits(text):
    """Multiset of ASCII digit runs ("2.50" -> 2, 50; "9:00" -> 9, 00)."""
    return collections.Counter(re.findall(r"[0-9]+", text))


def words(text):
    """Multiset of lower-cased word tokens (letters and digits)."""
    return collections.Counter(re.findall(r"\w+", text.lower()))


def load(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                err(f"{path}:{n}: blank line")
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                err(f"{path}:{n}: bad JSON ({e})")
    return rows


all_ids = set()
table = []
for dom in DOMAINS:
    lib = load(os.path.join(HERE, dom, "library.jsonl"))
    qs = load(os.path.join(HERE, dom, "queries.jsonl"))
    entries = {}

    # --- library -----------------------------------------------------------
    if len(lib) != N_ENTRIES:
        err(f"{dom}: {len(lib)} entries, want {N_ENTRIES}")
    for e in lib:
        if set(e) != LIB_KEYS:
            err(f"{dom}: entry keys {sorted(e)}")
            continue
        for k in LIB_KEYS:
            if not isinstance(e[k], str) or not e[k].strip():
                err(f"{e.get('id')}: empty or non-string {k}")
        if not re.fullmatch(re.escape(dom) + r"/[a-z0-9-]+", e["id"]):
            err(f"{e['id']}: id is not '{dom}/<slug>'")
        if e["id"] in all_ids:
            err(f"{e['id']}: duplicate id")
        all_ids.add(e["id"])
        if e["answer"] not in e["solution"]:
            err(f"{e['id']}: answer {e['answer']!r} not verbatim in solution")
        if sum(digits(e["problem"]).values()) < 2:
            err(f"{e['id']}: problem has fewer than 2 numbers")
        entries[e["id"]] = e

    # --- queries -----------------------------------------------------------
    if len(qs) != N_QUERIES:
        err(f"{dom}: {len(qs)} queries, want {N_QUERIES}")
    kinds = collections.Counter()
    seen_q = set()
    for i, q in enumerate(qs):
        if set(q) != Q_KEYS:
            err(f"{dom}: query keys {sorted(q)}")
            continue
        qid = q["id"]
        if qid in all_ids:
            err(f"{qid}: duplicate id")
        all_ids.add(qid)
        base = q["kind"].split("/")[0]
        kinds[q["kind"]] += 1
        if not re.fullmatch(re.escape(dom) + "-" + re.escape(base) + r"-[0-9]+", qid):
            err(f"{qid}: id is not '{dom}-{base}-<n>'")
        for k in ("question", "answer"):
            if not isinstance(q[k], str) or not q[k].strip():
                err(f"{qid}: empty or non-string {k}")
        if q["question"].strip().lower() in seen_q:
            err(f"{qid}: duplicate question")
        seen_q.add(q["question"].strip().lower())

        # expected layout: blocks of 4 per entry in library order, then uncovered
        block, pos = divmod(i, 4)
        if block < len(lib):
            entry = lib[block]
            want = BLOCK[pos]
            if q["kind"] != want:
                err(f"{qid}: kind {q['kind']!r}, want {want!r} at this position")
            prob = entry["problem"]
            if q["question"] == prob:
                err(f"{qid}: identical to its entry")
            if digits(q["question"]) != digits(prob):
                err(
                    f"{qid}: numbers {sorted(digits(q['question']).elements())} "
                    f"!= entry's {sorted(digits(prob).elements())}"
                )
            if words(q["question"]) != words(prob):
                diff = (words(q["question"]) - words(prob)) + (words(prob) - words(q["question"]))
                err(f"{qid}: words differ from entry beyond order: {dict(diff)}")
            if q["kind"] == PARA:
                if q["expect_entry"] != entry["id"]:
                    err(f"{qid}: expect_entry {q['expect_entry']!r}, want {entry['id']!r}")
                if q["answer"] != entry["answer"]:
                    err(f"{qid}: paraphrase answer {q['answer']!r} != entry {entry['answer']!r}")
            else:
                if q["expect_entry"] is not None:
                    err(f"{qid}: near-miss with expect_entry set")
                if q["answer"] == entry["answer"]:
                    err(f"{qid}: near-miss answer equals the entry's ({q['answer']!r})")
        else:
            if q["kind"] != UNC:
                err(f"{qid}: kind {q['kind']!r} after the entry blocks, want 'uncovered'")
            if q["expect_entry"] is not None:
                err(f"{qid}: uncovered with expect_entry set")
            if q["question"].strip().lower() in {e["problem"].strip().lower() for e in lib}:
                err(f"{qid}: uncovered question equals an entry")
        if q["expect_entry"] is not None and q["expect_entry"] not in entries:
            err(f"{qid}: expect_entry {q['expect_entry']!r} not in library")

    want_kinds = {PARA: 2 * N_ENTRIES, NEAR: 2 * N_ENTRIES, UNC: 1}
    if dict(kinds) != want_kinds:
        err(f"{dom}: kinds {dict(kinds)}, want {want_kinds}")

    # --- script and normalisation -------------------------------------------
    texts = [e[k] for e in lib for k in ("problem", "solution", "answer")] + [
        q[k] for q in qs for k in ("question", "answer") if isinstance(q.get(k), str)
    ]
    for t in texts:
        if unicodedata.normalize("NFC", t) != t:
            err(f"{dom}: not NFC: {t[:40]!r}")
    cyr = re.compile(r"[\u0400-\u04FF]")
    for t in [e["problem"] for e in lib] + [e["solution"] for e in lib] + [q["question"] for q in qs]:
        if dom == "russian" and not cyr.search(t):
            err(f"{dom}: no Cyrillic in {t[:40]!r}")
        if dom != "russian" and cyr.search(t):
            err(f"{dom}: Cyrillic in {t[:40]!r}")

    table.append((dom, len(lib), kinds[PARA], kinds[NEAR], kinds[UNC], len(qs)))

print("| domain | entries | paraphrase/moved | near-miss/order | uncovered | queries |")
print("|---|---|---|---|---|---|")
tot = [0] * 5
for row in table:
    print("| " + " | ".join(str(x) for x in row) + " |")
    tot = [a + b for a, b in zip(tot, row[1:])]
print("| total | " + " | ".join(str(x) for x in tot) + " |")

if errors:
    print(f"\n{len(errors)} problem(s):")
    for m in errors:
        print("  " + m)
    sys.exit(1)
print("\nOK")
