#!/usr/bin/env python3
"""Validate the crosslingual held-out routing set (standard library only).

Usage: python3 examples/crosslingual/check.py [-v]
Exits 1 on any problem.
"""

import glob
import json
import os
import re
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.dirname(HERE)
VERBOSE = "-v" in sys.argv[1:]

# folder -> (entry language, query language)
DOMAINS = {
    "en-to-es": ("en", "es"),
    "en-to-de": ("en", "de"),
    "fr-to-en": ("fr", "en"),
    "ja-to-en": ("ja", "en"),
}
ENTRIES = 8
PARA_PER_ENTRY = 2
NM_PER_ENTRY = 2
UNCOVERED = 2
PARA_KINDS = {"translation", "translated-rewording"}
NM_KINDS = {
    "numbers",
    "asked-quantity",
    "object",
    "action",
    "role",
    "swapped-roles",
    "negation",
    "unit",
    "time-period",
    "before-after",
    "order",
    "condition",
}
LIB_KEYS = {"id", "problem", "solution", "answer"}
Q_KEYS = {"id", "question", "kind", "expect_entry", "near_entry", "answer"}
RUN = 8  # shared word runs of this length with other example folders are errors
NEAR_RUN = 6  # shorter shared runs (stock phrases such as "what is the area of a") are only listed
# folders never read by this check (held out from the author of this set)
SKIP_FOLDERS = {"crosslingual", "edits-dev", "judge-dev", "results"}

STOP = {
    "en": {
        "the",
        "how",
        "what",
        "is",
        "of",
        "does",
        "do",
        "many",
        "much",
        "a",
        "an",
        "in",
        "and",
        "which",
        "his",
        "her",
        "its",
        "at",
        "for",
        "to",
        "old",
        "long",
        "i",
        "my",
        "on",
        "can",
        "when",
        "every",
        "you",
        "we",
        "are",
        "get",
        "there",
        "from",
    },
    "es": {
        "el",
        "la",
        "los",
        "las",
        "de",
        "del",
        "un",
        "una",
        "cuántos",
        "cuántas",
        "cuánto",
        "qué",
        "tiene",
        "es",
        "en",
        "y",
        "al",
        "su",
        "se",
        "por",
        "para",
        "mide",
    },
    "de": {
        "der",
        "die",
        "das",
        "den",
        "dem",
        "ein",
        "eine",
        "einen",
        "ist",
        "hat",
        "wie",
        "viele",
        "viel",
        "welcher",
        "und",
        "von",
        "für",
        "sein",
        "seine",
        "ihr",
        "sind",
        "man",
        "er",
        "sie",
        "es",
        "bei",
        "im",
        "mit",
        "zu",
        "auf",
        "lang",
        "groß",
    },
    "fr": {
        "le",
        "la",
        "les",
        "de",
        "du",
        "des",
        "un",
        "une",
        "est",
        "combien",
        "quelle",
        "quel",
        "a",
        "à",
        "son",
        "sa",
        "et",
        "pour",
        "en",
        "peut",
        "on",
    },
}
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uff00-\uffef]")

errors = []


def err(msg):
    errors.append(msg)


def norm(text):
    return " ".join(re.findall(r"\w+", unicodedata.normalize("NFKC", text).lower()))


def words(text):
    return re.findall(r"\w+", unicodedata.normalize("NFKC", text).lower())


def lang_of(text):
    """Best-guess language among ja/en/es/de/fr from script and stop words."""
    if CJK.search(text):
        return "ja"
    ws = words(text)
    score = {lang: sum(w in stop for w in ws) for lang, stop in STOP.items()}
    if "¿" in text:
        score["es"] += 3
    best = max(score.values())
    winners = [lang for lang, s in score.items() if s == best]
    return winners[0] if len(winners) == 1 and best > 0 else None


def load(path):
    rows = []
    if not os.path.exists(path):
        err(f"{path}: missing")
        return rows
    with open(path, encoding="utf-8") as fh:
        for k, line in enumerate(fh, 1):
            if not line.strip():
                err(f"{path}:{k}: blank line")
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                err(f"{path}:{k}: bad JSON ({exc})")
    return rows


all_ids = set()
texts = []  # (id, text) of every problem and question, for the duplicate checks
table = []
for dom, (src, dst) in DOMAINS.items():
    lib = load(os.path.join(HERE, dom, "library.jsonl"))
    qs = load(os.path.join(HERE, dom, "queries.jsonl"))
    ent = {}
    for e in lib:
        if set(e) != LIB_KEYS:
            err(f"{dom}: library keys {sorted(e)}")
            continue
        if not re.fullmatch(re.escape(dom) + r"/[a-z0-9-]+", str(e["id"])):
            err(f"{e['id']}: id is not {dom}/<slug>")
        if e["id"] in all_ids:
            err(f"{e['id']}: duplicate id")
        all_ids.add(e["id"])
        ent[e["id"]] = e
        for k in ("problem", "solution", "answer"):
            if not isinstance(e[k], str) or not e[k].strip():
                err(f"{e['id']}: empty {k}")
        if isinstance(e["problem"], str):
            if lang_of(e["problem"]) != src:
                err(f"{e['id']}: problem does not look like {src} (guessed {lang_of(e['problem'])})")
            texts.append((e["id"], e["problem"]))
    if len(lib) != ENTRIES:
        err(f"{dom}: {len(lib)} entries (want {ENTRIES})")
    entry_answers = {norm(e["answer"]) for e in ent.values() if isinstance(e.get("answer"), str)}

    block = ["paraphrase"] * PARA_PER_ENTRY + ["near-miss"] * NM_PER_ENTRY
    want = [k for _ in range(ENTRIES) for k in block] + ["uncovered"] * UNCOVERED
    if len(qs) != len(want):
        err(f"{dom}: {len(qs)} queries (want {len(want)})")
    count = {"paraphrase": 0, "near-miss": 0, "uncovered": 0}
    for i, q in enumerate(qs):
        if set(q) != Q_KEYS:
            err(f"{dom}: query keys {sorted(q)}")
            continue
        top, _, sub = str(q["kind"]).partition("/")
        if top not in count:
            err(f"{q['id']}: unknown kind {q['kind']!r}")
            continue
        count[top] += 1
        if q["id"] != f"{dom}-{top}-{count[top]}":
            err(f"{q['id']}: id should be {dom}-{top}-{count[top]}")
        if q["id"] in all_ids:
            err(f"{q['id']}: duplicate id")
        all_ids.add(q["id"])
        if not isinstance(q["answer"], str) or not q["answer"].strip():
            err(f"{q['id']}: empty answer")
            continue
        if not isinstance(q["question"], str) or not q["question"].strip():
            err(f"{q['id']}: empty question")
            continue
        texts.append((q["id"], q["question"]))
        if lang_of(q["question"]) != dst:
            err(f"{q['id']}: question does not look like {dst} (guessed {lang_of(q['question'])})")
        if i < len(want) and top != want[i]:
            err(f"{q['id']}: a {want[i]} belongs at position {i + 1}")
        blk = lib[i // len(block)]["id"] if top != "uncovered" and i // len(block) < len(lib) else None
        if top == "paraphrase":
            if sub not in PARA_KINDS:
                err(f"{q['id']}: unknown paraphrase kind {sub!r}")
            if q["near_entry"] is not None:
                err(f"{q['id']}: paraphrase has near_entry")
            if q["expect_entry"] not in ent:
                err(f"{q['id']}: expect_entry {q['expect_entry']!r} is not an entry of {dom}")
            elif q["expect_entry"] != blk:
                err(f"{q['id']}: expect_entry {q['expect_entry']} is not its block's entry {blk}")
            elif q["answer"] != ent[q["expect_entry"]]["answer"]:
                err(f"{q['id']}: answer {q['answer']!r} != entry answer {ent[q['expect_entry']]['answer']!r}")
        elif top == "near-miss":
            if sub not in NM_KINDS:
                err(f"{q['id']}: unknown near-miss kind {sub!r}")
            if q["expect_entry"] is not None:
                err(f"{q['id']}: near-miss has expect_entry")
            if q["near_entry"] not in ent:
                err(f"{q['id']}: near_entry {q['near_entry']!r} is not an entry of {dom}")
            elif q["near_entry"] != blk:
                err(f"{q['id']}: near_entry {q['near_entry']} is not its block's entry {blk}")
            elif norm(q["answer"]) == norm(ent[q["near_entry"]]["answer"]):
                err(f"{q['id']}: near-miss answer equals its near_entry's answer {q['answer']!r}")
        else:
            if sub:
                err(f"{q['id']}: kind should be plain 'uncovered'")
            if q["expect_entry"] is not None or q["near_entry"] is not None:
                err(f"{q['id']}: uncovered query points at an entry")
            if norm(q["answer"]) in entry_answers:
                err(f"{q['id']}: uncovered answer {q['answer']!r} equals an entry's answer")
    if count != {"paraphrase": PARA_PER_ENTRY * ENTRIES, "near-miss": NM_PER_ENTRY * ENTRIES, "uncovered": UNCOVERED}:
        err(f"{dom}: counts {count}")
    table.append((dom, src, dst, len(lib), count["paraphrase"], count["near-miss"], count["uncovered"], len(qs)))

# no duplicate texts inside the set
seen = {}
for tid, t in texts:
    k = norm(t)
    if k in seen:
        err(f"{tid}: same text as {seen[k]}")
    seen.setdefault(k, tid)

# no repeats of problems in the other example folders (library problem texts only)
others = []
paths = sorted(
    glob.glob(os.path.join(EXAMPLES, "*", "*", "library.jsonl"))
    + glob.glob(os.path.join(EXAMPLES, "*", "library.jsonl"))
)
paths += [os.path.join(EXAMPLES, "library.jsonl")]
for p in paths:
    rel = os.path.relpath(p, EXAMPLES)
    if rel.split(os.sep)[0] in SKIP_FOLDERS or not os.path.exists(p):
        continue
    with open(p, encoding="utf-8") as fh:
        for line in fh:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(r, dict) and isinstance(r.get("problem"), str):
                others.append((f"{rel}:{r.get('id')}", r["problem"]))
other_exact = {norm(t): oid for oid, t in others}
other_runs, other_near, near = {}, {}, []
for oid, t in others:
    ws = words(t)
    for i in range(len(ws) - RUN + 1):
        other_runs.setdefault(tuple(ws[i : i + RUN]), oid)
    for i in range(len(ws) - NEAR_RUN + 1):
        other_near.setdefault(tuple(ws[i : i + NEAR_RUN]), oid)
n_dup = 0
for tid, t in texts:
    if norm(t) in other_exact:
        n_dup += 1
        err(f"{tid}: same text as {other_exact[norm(t)]}")
    ws = words(t)
    for i in range(len(ws) - RUN + 1):
        r = tuple(ws[i : i + RUN])
        if r in other_runs:
            n_dup += 1
            err(f"{tid}: shares the {RUN}-word run {' '.join(r)!r} with {other_runs[r]}")
            break
    for i in range(len(ws) - NEAR_RUN + 1):
        r = tuple(ws[i : i + NEAR_RUN])
        if r in other_near:
            near.append((tid, " ".join(r), other_near[r]))
            break

print("| folder | entries | questions | entries | paraphrase | near-miss | uncovered | queries |")
print("|---|---|---|---|---|---|---|---|")
tot = [0] * 5
for row in table:
    print("| {} | {} | {} | {} | {} | {} | {} | {} |".format(*row))
    tot = [a + b for a, b in zip(tot, row[3:])]
print("| total | | | {} | {} | {} | {} | {} |".format(*tot))
print(
    f"duplicate check: {len(texts)} texts against {len(others)} library problems elsewhere in examples/: "
    f"{n_dup} exact or {RUN}-word hits, {len(near)} texts with a shared {NEAR_RUN}-word run"
)
for tid, r, oid in near:
    print(f"  {NEAR_RUN}-word run: {tid}: {r!r} (also in {oid})")
if VERBOSE:
    for tid, t in texts:
        print(f"  {tid:32} {lang_of(t)}  {t[:80]}")
for e in errors:
    print("ERROR:", e)
print("OK" if not errors else f"{len(errors)} error(s)")
sys.exit(1 if errors else 0)
