#!/usr/bin/env python3
"""Validate the held-out small-edit routing set E (stdlib only). Usage: python3 examples/edits-e/check.py"""

import difflib
import json
import os
import re
import sys
import unicodedata
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
DOMAINS = ["polish", "indonesian", "ukrainian", "statistics", "energy", "construction"]
ENTRIES = 8
NM = {"asked-quantity", "concept", "negation", "operation", "unit", "order", "numbers", "role-swap"}
NM_TWICE = {"role-swap", "unit"}
PARA = {"synonym", "moved", "filler", "spelled-out", "register"}
# A small edit: at most this many changed tokens, as difflib aligns them (for moved and role-swap: the
# bag-of-tokens difference, since a reordering aligns badly). CJK text has more, shorter tokens.
MAX_EDIT = {"paraphrase": 6, "near-miss": 4}
MAX_EDIT_CJK = {"paraphrase": 10, "near-miss": 6}
SCRIPT = {
    "ukrainian": re.compile(r"[\u0400-\u04FF]"),  # Cyrillic
}
# Polish: every problem (and every query) has at least one Polish letter.
POLISH_LETTER = re.compile(r"[ąćęłńóśźżĄĆĘŁŃÓŚŹŻ]")
# Ukrainian: every problem (and every query) has at least one of the Ukrainian-only letters і ї є ґ.
UKRAINIAN_LETTER = re.compile(r"[іїєґІЇЄҐ]")
LETTER_CHECK = {"polish": (POLISH_LETTER, "Polish"), "ukrainian": (UKRAINIAN_LETTER, "Ukrainian")}
# All text is NFC (precomposed Polish and Ukrainian letters).
NFC_DOMAINS = {"polish", "ukrainian"}
CJK = re.compile(r"[\u3040-\u30FF\u4E00-\u9FFF]")
# Tokens: a katakana run is one word, each kanji/hanzi/hiragana character is one, else \w+ runs and single symbols.
# Devanagari and Bengali vowel signs, virama and nukta (and the Bengali candrabindu, anusvara, visarga and au length
# mark) are not \w in Python's re, so they are added to the word runs here (otherwise every Hindi or Bengali word
# would fall apart into letter-and-sign fragments); this changes no other script.
DEVA_MARK = "\u0900-\u0903\u093a-\u094f\u0951-\u0957\u0962\u0963"
BENG_MARK = "\u0981-\u0983\u09bc\u09be-\u09cd\u09d7\u09e2\u09e3"
TOKEN = re.compile(
    r"[\u30A0-\u30FF]+|[\u3040-\u309F\u4E00-\u9FFF]|(?:[^\W\u3040-\u30FF\u4E00-\u9FFF]|["
    + DEVA_MARK
    + BENG_MARK
    + r"])+|[^\w\s]"
)
REORDER = {"moved", "role-swap"}  # reorderings: measured as a bag-of-tokens difference, not as an alignment


def edit_size(a, b, sub):
    ta, tb = TOKEN.findall(a), TOKEN.findall(b)
    if sub in REORDER:
        ca, cb = Counter(ta), Counter(tb)
        return max(sum((ca - cb).values()), sum((cb - ca).values()))
    ops = difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


errors = []
ids = set()
print("| domain | entries | paraphrase | near-miss | uncovered | queries | max edit (para / near-miss) |")
print("|---|---|---|---|---|---|---|")
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
    pk = Counter()
    per = Counter()
    nm_per = Counter()
    maxed = Counter()
    cjk = dom in ("japanese", "chinese")
    limit = MAX_EDIT_CJK if cjk else MAX_EDIT
    for i, q in enumerate(qs):
        if set(q) != {"id", "question", "kind", "expect_entry", "answer"}:
            errors.append(f"{dom}: keys {q}")
        top, _, sub = q["kind"].partition("/")
        c[top] += 1
        if q["id"] != f"{dom}-{top}-{c[top]}":
            errors.append(f"bad query id {q['id']}")
        if q["id"] in ids:
            errors.append(f"dup {q['id']}")
        ids.add(q["id"])
        if not q["answer"]:
            errors.append(f"{q['id']}: empty answer")
        if top in ("paraphrase", "near-miss"):
            # queries come in blocks of 4 per entry: 2 paraphrases, then 2 near-misses
            base = lib[i // 4] if i // 4 < len(lib) else None
            if base is None:
                errors.append(f"{q['id']}: no entry block")
                continue
            n = edit_size(base["problem"], q["question"], sub)
            maxed[top] = max(maxed[top], n)
            if q["question"] == base["problem"]:
                errors.append(f"{q['id']}: identical to {base['id']}")
            elif n > limit[top]:
                errors.append(f"{q['id']}: edit of {n} tokens from {base['id']} (max {limit[top]})")
        if top == "paraphrase":
            if sub not in PARA:
                errors.append(f"{q['id']}: kind")
            pk[sub] += 1
            e = ent.get(q["expect_entry"])
            if e is None:
                errors.append(f"{q['id']}: expect_entry {q['expect_entry']} missing")
            elif e is not base:
                errors.append(f"{q['id']}: expect_entry is not the entry of its block")
            elif q["answer"] != e["answer"]:
                errors.append(f"{q['id']}: answer != entry")
            else:
                per[e["id"]] += 1
        elif top == "near-miss":
            if sub not in NM:
                errors.append(f"{q['id']}: kind")
            nmk[sub] += 1
            if q["expect_entry"] is not None:
                errors.append(f"{q['id']}: near-miss fields")
            elif q["answer"] == base["answer"]:
                errors.append(f"{q['id']}: same answer as {base['id']}")
            else:
                nm_per[base["id"]] += 1
        elif top == "uncovered":
            if q["expect_entry"] is not None:
                errors.append(f"{q['id']}: uncovered expect_entry")
        else:
            errors.append(f"{q['id']}: kind {q['kind']}")
        if dom in SCRIPT and not SCRIPT[dom].search(q["question"]):
            errors.append(f"{q['id']}: not in {dom} script")
    if dom in LETTER_CHECK:
        pat, name = LETTER_CHECK[dom]
        for e in lib:
            if not pat.search(e["problem"]):
                errors.append(f"{e['id']}: no {name} letter in problem")
        for q in qs:
            if not pat.search(q["question"]):
                errors.append(f"{q['id']}: no {name} letter in question")
    if dom in NFC_DOMAINS:
        texts = [(e["id"], v) for e in lib for v in e.values()] + [(q["id"], v) for q in qs for v in q.values()]
        for i, v in texts:
            if isinstance(v, str) and unicodedata.normalize("NFC", v) != v:
                errors.append(f"{i}: not NFC")
    if dom in SCRIPT:
        for e in lib:
            if not (SCRIPT[dom].search(e["problem"]) and SCRIPT[dom].search(e["solution"])):
                errors.append(f"{e['id']}: not in {dom} script")
    if len(lib) != ENTRIES or c["paraphrase"] != 2 * ENTRIES or c["near-miss"] != 2 * ENTRIES or c["uncovered"] != 2:
        errors.append(f"{dom}: counts {len(lib)} {dict(c)}")
    if any(per[i] != 2 for i in ent) or any(nm_per[i] != 2 for i in ent):
        errors.append(f"{dom}: paraphrases/near-misses per entry {dict(per)} {dict(nm_per)}")
    if set(nmk) != NM:
        errors.append(f"{dom}: near-miss kinds missing {NM - set(nmk)}")
    for k in NM_TWICE:
        if nmk[k] < 2:
            errors.append(f"{dom}: near-miss/{k} appears {nmk[k]} times (want >= 2)")
    if set(pk) != PARA:
        errors.append(f"{dom}: paraphrase kinds missing {PARA - set(pk)}")
    print(
        f"| {dom} | {len(lib)} | {c['paraphrase']} | {c['near-miss']} | {c['uncovered']} | {len(qs)} "
        f"| {maxed['paraphrase']} / {maxed['near-miss']} |"
    )
    tot.update(entries=len(lib), queries=len(qs), **c)
print(
    f"| total | {tot['entries']} | {tot['paraphrase']} | {tot['near-miss']} | {tot['uncovered']} | {tot['queries']} | |"
)
for e in errors:
    print("ERROR:", e)
sys.exit(1 if errors else 0)
