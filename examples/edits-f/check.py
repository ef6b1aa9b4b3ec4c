#!/usr/bin/env python3
"""Validate the held-out small-edit routing set F (stdlib only).

Usage: python3 examples/edits-f/check.py [-v]

Checks the structure, the counts and kinds, the ids, the answers, the size of every edit, the script, digits and
decimal separator of each language, and that nothing repeats a problem or question of the other examples/ folders
(exact match or a shared run of 6 words). Exits 1 on any problem. -v also lists every edit with its size.
"""

import difflib
import glob
import json
import os
import re
import sys
import unicodedata
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.dirname(HERE)
VERBOSE = "-v" in sys.argv[1:]

DOMAINS = ["bengali", "hindi", "turkish", "arabic", "greek", "indonesian", "vietnamese", "english-home"]
ENTRIES = 6
PER_ENTRY = ("paraphrase", "paraphrase", "near-miss", "near-miss")  # the block of queries after each entry
UNCOVERED = 1
PARA = {"synonym", "moved", "filler", "spelled-out", "register"}
NM = {"asked-quantity", "concept", "negation", "operation", "unit", "order", "numbers", "role-swap"}
REORDER = {"moved", "role-swap"}  # measured as a bag-of-words difference, since a reordering aligns badly
MAX_WORDS = 4  # changed words, as difflib aligns the word tokens (bag difference for REORDER)
MAX_TOKENS = 6  # the same, counting punctuation and symbols as tokens too

# Folders read only for the duplicate check (their library.jsonl and queries.jsonl files).
DUP_FOLDERS = ["edits", "edits-b", "edits-c", "edits-d", "edits-e", "domains", "domains-b", "code", "hard"]
DUP_TOP = ["library.jsonl", "queries.jsonl"]
RUN = 6  # a shared run of this many words is an error
NEAR_RUN = 5  # shared runs of this many words are only listed

# Script: every problem, solution and question of the domain has a character of this class.
SCRIPT = {
    "bengali": ("Bengali", re.compile(r"[\u0980-\u09FF]")),
    "hindi": ("Devanagari", re.compile(r"[\u0900-\u097F]")),
    "arabic": ("Arabic", re.compile(r"[\u0600-\u06FF]")),
    "greek": ("Greek", re.compile(r"[\u0370-\u03FF\u1F00-\u1FFF]")),
    "turkish": ("Turkish letter", re.compile(r"[çğıöşüÇĞİÖŞÜ]")),
    "vietnamese": ("Vietnamese letter", re.compile(r"[ăâđêôơưĂÂĐÊÔƠƯ\u1EA0-\u1EF9]")),
}
# Digits: Bengali and Arabic are written with their own digits and no ASCII digits; the rest with ASCII digits only.
ASCII_DIGIT = re.compile(r"[0-9]")
OWN_DIGITS = {"bengali": re.compile(r"[০-৯]"), "arabic": re.compile(r"[٠-٩]")}
OTHER_DIGIT = re.compile(r"[০-৯٠-٩۰-۹०-९]")
# Decimal separator. Comma languages may use a dot only as a thousands separator (1.700) or in an Indonesian clock
# time (pukul 07.20); point languages may use a comma only as a thousands separator (15,600). Arabic uses U+066B.
COMMA_DECIMAL = {"turkish", "greek", "indonesian", "vietnamese"}
POINT_DECIMAL = {"english-home", "hindi", "bengali"}
BAD_POINT = re.compile(r"\d+\.\d+")
CLOCK = re.compile(r"\bpukul \d{1,2}\.\d{2}\b")  # Indonesian clock time, e.g. pukul 07.20
THOUSANDS_DOT = re.compile(r"^\d{1,3}(\.\d{3})+$")
BAD_COMMA = re.compile(r"\d+,\d+")
THOUSANDS_COMMA = re.compile(r"^\d{1,3}(,\d{3})+$")
ARABIC_BAD_SEP = re.compile(r"[٠-٩][.,،][٠-٩]")
NUMBER = re.compile(r"\d+(?:[.,٫]\d+)*")


def is_word_char(ch):
    # letters, digits and underscore, plus combining marks (Devanagari and Bengali vowel signs and virama, Arabic
    # harakat and shadda), which Python's \w does not match and which would otherwise split words apart
    return ch.isalnum() or ch == "_" or unicodedata.category(ch).startswith("M")


def tokens(text):
    """Lower-cased tokens: runs of word characters, and every other non-space character on its own."""
    out, cur = [], []
    for ch in unicodedata.normalize("NFC", text):
        if is_word_char(ch):
            cur.append(ch)
            continue
        if cur:
            out.append("".join(cur).lower())
            cur = []
        if not ch.isspace():
            out.append(ch)
    if cur:
        out.append("".join(cur).lower())
    return out


def words(text):
    return [t for t in tokens(text) if is_word_char(t[0])]


def edit_size(a, b, reorder):
    """Changed tokens between sequences a and b: the difflib alignment, or the bag difference for a reordering."""
    if reorder:
        ca, cb = Counter(a), Counter(b)
        return max(sum((ca - cb).values()), sum((cb - ca).values()))
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def numbers(text):
    return Counter(NUMBER.findall(text))


def runs(ws, n):
    return {tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)}


errors = []


def err(msg):
    errors.append(msg)


def load(path):
    rows = []
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


# ---------------------------------------------------------------- structure, kinds, answers, edits, script
ids = set()
mine = []  # (id, text) of every problem and question here, for the duplicate check
table = []
edit_rows = []
total = Counter()
for dom in DOMAINS:
    lib = load(os.path.join(HERE, dom, "library.jsonl"))
    qs = load(os.path.join(HERE, dom, "queries.jsonl"))
    ent = {}
    for e in lib:
        if set(e) != {"id", "problem", "solution", "answer"}:
            err(f"{dom}: library keys {sorted(e)}")
            continue
        if not re.fullmatch(re.escape(dom) + r"/[a-z0-9-]+", e["id"]):
            err(f"{e['id']}: id is not {dom}/<slug>")
        if e["id"] in ids:
            err(f"{e['id']}: duplicate id")
        ids.add(e["id"])
        ent[e["id"]] = e
        for k in ("problem", "solution", "answer"):
            if not isinstance(e[k], str) or not e[k].strip():
                err(f"{e['id']}: empty {k}")
        if e["answer"] not in e["solution"]:
            err(f"{e['id']}: answer {e['answer']!r} not in solution")
        if not NUMBER.search(e["problem"]):
            err(f"{e['id']}: problem has no number")
        mine.append((e["id"], e["problem"]))
    if len(lib) != ENTRIES:
        err(f"{dom}: {len(lib)} entries (want {ENTRIES})")

    want = [k for _ in range(ENTRIES) for k in PER_ENTRY] + ["uncovered"] * UNCOVERED
    if len(qs) != len(want):
        err(f"{dom}: {len(qs)} queries (want {len(want)})")
    c, pk, nk = Counter(), Counter(), Counter()
    maxw = Counter()
    for i, q in enumerate(qs):
        if set(q) != {"id", "question", "kind", "expect_entry", "answer"}:
            err(f"{dom}: query keys {sorted(q)}")
            continue
        top, _, sub = q["kind"].partition("/")
        c[top] += 1
        if q["id"] != f"{dom}-{top}-{c[top]}":
            err(f"{q['id']}: id should be {dom}-{top}-{c[top]}")
        if q["id"] in ids:
            err(f"{q['id']}: duplicate id")
        ids.add(q["id"])
        if not isinstance(q["answer"], str) or not q["answer"].strip():
            err(f"{q['id']}: answer missing")
        if not isinstance(q["question"], str) or not q["question"].strip():
            err(f"{q['id']}: question missing")
            continue
        mine.append((q["id"], q["question"]))
        if i < len(want) and top != want[i]:
            err(f"{q['id']}: a {want[i]} belongs at position {i + 1}")
        base = lib[i // 4] if top in ("paraphrase", "near-miss") and i // 4 < len(lib) else None
        if top == "paraphrase":
            if sub not in PARA:
                err(f"{q['id']}: unknown paraphrase kind {sub!r}")
            pk[sub] += 1
            if base is None or q["expect_entry"] != base["id"]:
                err(f"{q['id']}: expect_entry {q['expect_entry']!r} is not the entry of its block")
            elif q["answer"] != base["answer"]:
                err(f"{q['id']}: paraphrase answer {q['answer']!r} != entry answer {base['answer']!r}")
        elif top == "near-miss":
            if sub not in NM:
                err(f"{q['id']}: unknown near-miss kind {sub!r}")
            nk[sub] += 1
            if q["expect_entry"] is not None:
                err(f"{q['id']}: near-miss has expect_entry")
            if base is not None and q["answer"] == base["answer"]:
                err(f"{q['id']}: near-miss answer equals the entry's ({q['answer']!r})")
        elif top == "uncovered":
            if sub:
                err(f"{q['id']}: kind should be plain 'uncovered'")
            if q["expect_entry"] is not None:
                err(f"{q['id']}: uncovered has expect_entry")
            if any(q["answer"] == e["answer"] for e in lib):
                err(f"{q['id']}: uncovered answer equals an entry's answer")
        else:
            err(f"{q['id']}: unknown kind {q['kind']!r}")
        if base is None:
            continue
        # edit size against the entry of the block
        if q["question"] == base["problem"]:
            err(f"{q['id']}: identical to {base['id']}")
            continue
        reorder = sub in REORDER
        nw = edit_size(words(base["problem"]), words(q["question"]), reorder)
        nt = edit_size(tokens(base["problem"]), tokens(q["question"]), reorder)
        maxw[top] = max(maxw[top], nw)
        edit_rows.append((q["id"], q["kind"], nw, nt))
        if words(base["problem"]) == words(q["question"]):
            err(f"{q['id']}: same words in the same order as {base['id']}")
        if nw > MAX_WORDS or nt > MAX_TOKENS:
            err(f"{q['id']}: edit of {nw} words / {nt} tokens from {base['id']} (max {MAX_WORDS} / {MAX_TOKENS})")
        # the numbers: a paraphrase keeps them (spelled-out drops some, never adds one); numbers changes them
        nb, nq = numbers(base["problem"]), numbers(q["question"])
        if top == "paraphrase" and sub != "spelled-out" and nb != nq:
            err(f"{q['id']}: paraphrase changes the numbers {dict(nb)} -> {dict(nq)}")
        if sub == "spelled-out" and (nq - nb or nq == nb):
            err(f"{q['id']}: spelled-out should replace a number by words")
        if sub == "numbers" and nb == nq:
            err(f"{q['id']}: near-miss/numbers changes no number")
    # kinds and their spread
    if c["paraphrase"] != 2 * ENTRIES or c["near-miss"] != 2 * ENTRIES or c["uncovered"] != UNCOVERED:
        err(f"{dom}: counts {dict(c)}")
    if set(pk) != PARA:
        err(f"{dom}: paraphrase kinds missing {sorted(PARA - set(pk))}")
    lo, hi = (2 * ENTRIES) // len(PARA), -(-(2 * ENTRIES) // len(PARA))
    for k in PARA:
        if not lo <= pk[k] <= hi:
            err(f"{dom}: paraphrase/{k} appears {pk[k]} times (want {lo} to {hi}, spread evenly)")
    if set(nk) != NM:
        err(f"{dom}: near-miss kinds missing {sorted(NM - set(nk))}")
    # script, digits, decimal separator, NFC
    texts = [(e["id"], k, e[k]) for e in lib for k in ("problem", "solution", "answer")]
    texts += [(q["id"], k, q[k]) for q in qs for k in ("question", "answer")]
    for tid, k, v in texts:
        if not isinstance(v, str):
            continue
        if unicodedata.normalize("NFC", v) != v:
            err(f"{tid}: {k} is not NFC")
        if dom in SCRIPT and k in ("problem", "solution", "question") and not SCRIPT[dom][1].search(v):
            err(f"{tid}: {k} has no {SCRIPT[dom][0]} character")
        if dom in OWN_DIGITS:
            if ASCII_DIGIT.search(v):
                err(f"{tid}: {k} has ASCII digits (this domain uses its own digits)")
            if NUMBER.search(v) and not OWN_DIGITS[dom].search(v):
                err(f"{tid}: {k} has numbers in another script")
        elif OTHER_DIGIT.search(v):
            err(f"{tid}: {k} has non-ASCII digits")
        if dom in COMMA_DECIMAL:
            for m in BAD_POINT.finditer(CLOCK.sub("pukul", v)):
                if not THOUSANDS_DOT.match(m.group()):
                    err(f"{tid}: {k} has a decimal point {m.group()!r} (this language uses a comma)")
        if dom in POINT_DECIMAL:
            for m in BAD_COMMA.finditer(v):
                if not THOUSANDS_COMMA.match(m.group()):
                    err(f"{tid}: {k} has a decimal comma {m.group()!r} (this language uses a point)")
        if dom == "arabic" and ARABIC_BAD_SEP.search(v):
            err(f"{tid}: {k} separates Arabic digits with '.', ',' or '،' (use ٫)")
    if dom == "english-home":
        for q in qs:
            if re.search(r"[^\x00-\x7F£π²³×÷−°]", q["question"]):
                err(f"{q['id']}: unexpected non-English character")
    table.append(
        (dom, len(lib), c["paraphrase"], c["near-miss"], c["uncovered"], len(qs), maxw["paraphrase"], maxw["near-miss"])
    )
    total.update(entries=len(lib), paraphrase=c["paraphrase"], nm=c["near-miss"], unc=c["uncovered"], queries=len(qs))
    total.update({f"p/{k}": v for k, v in pk.items()})
    total.update({f"n/{k}": v for k, v in nk.items()})

# questions are unique within the set
seen = {}
for tid, t in mine:
    key = " ".join(words(t))
    if key in seen:
        err(f"{tid}: same text as {seen[key]}")
    seen[key] = tid

# ---------------------------------------------------------------- duplicates against the other folders
others = []
paths = [os.path.join(EXAMPLES, f) for f in DUP_TOP]
for folder in DUP_FOLDERS:
    paths += sorted(glob.glob(os.path.join(EXAMPLES, folder, "**", "library.jsonl"), recursive=True))
    paths += sorted(glob.glob(os.path.join(EXAMPLES, folder, "**", "queries.jsonl"), recursive=True))
for p in paths:
    if not os.path.exists(p):
        err(f"duplicate check: {os.path.relpath(p, EXAMPLES)} missing")
        continue
    with open(p, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            r = json.loads(line)
            for k in ("problem", "question"):
                if isinstance(r.get(k), str):
                    others.append((f"{os.path.relpath(p, EXAMPLES)}:{r.get('id')}", r[k]))
other_exact = {}
other_runs, other_near = {}, {}
for oid, t in others:
    ws = words(t)
    other_exact.setdefault(" ".join(ws), oid)
    for r in runs(ws, RUN):
        other_runs.setdefault(r, oid)
    for r in runs(ws, NEAR_RUN):
        other_near.setdefault(r, oid)
n_exact = n_run = 0
near = []
for tid, t in mine:
    ws = words(t)
    if " ".join(ws) in other_exact:
        n_exact += 1
        err(f"{tid}: exact duplicate of {other_exact[' '.join(ws)]}")
    for r in sorted(runs(ws, RUN)):
        if r in other_runs:
            n_run += 1
            err(f"{tid}: shares the {RUN}-word run {' '.join(r)!r} with {other_runs[r]}")
    for r in sorted(runs(ws, NEAR_RUN)):
        if r in other_near:
            near.append((tid, " ".join(r), other_near[r]))

# ---------------------------------------------------------------- report
print("| domain | entries | paraphrase | near-miss | uncovered | queries | max words changed (para / near-miss) |")
print("|---|---|---|---|---|---|---|")
for row in table:
    print("| {} | {} | {} | {} | {} | {} | {} / {} |".format(*row))
print(f"| total | {total['entries']} | {total['paraphrase']} | {total['nm']} | {total['unc']} | {total['queries']} | |")
print()
print("paraphrase kinds: " + ", ".join(f"{k} {total['p/' + k]}" for k in sorted(PARA)))
print("near-miss kinds: " + ", ".join(f"{k} {total['n/' + k]}" for k in sorted(NM)))
print(
    f"duplicates: {len(mine)} texts against {len(others)} problems and questions in {len(paths)} files: "
    f"{n_exact} exact, {n_run} shared {RUN}-word runs, {len(near)} shared {NEAR_RUN}-word runs"
)
for tid, r, oid in near:
    print(f"  {NEAR_RUN}-word run: {tid}: {r!r} (also in {oid})")
if VERBOSE:
    for qid, kind, nw, nt in edit_rows:
        print(f"  {qid:32} {kind:28} {nw} words / {nt} tokens")
for e in errors:
    print("ERROR:", e)
print("OK" if not errors else f"{len(errors)} error(s)")
sys.exit(1 if errors else 0)
