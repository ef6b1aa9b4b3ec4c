#!/usr/bin/env python3
"""Validate the hand-written routing evaluation set in this folder (stdlib only).

Usage: python3 examples/domains-b/check.py   (exit status 1 on any problem)
"""

import json
import os
import re
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
DOMAINS = ["astronomy", "electronics", "cooking", "calendar", "probability", "sql", "italian", "portuguese", "korean"]
PARAPHRASE_KINDS = ["new-words", "reordered", "formal", "casual"]
PARAS_PER_ENTRY = 2  # exactly
NEAR_MISSES_PER_ENTRY = 2  # exactly, in total per domain
MIN_PER_NEAR_MISS_KIND = 2  # each of the seven kinds, per domain
UNCOVERED = 4
NEAR_MISS_KINDS = ["asked-quantity", "concept", "negation", "operation", "unit", "order", "numbers"]
TOP_KINDS = ["paraphrase", "near-miss", "uncovered"]
ENTRY_KEYS = {"id", "problem", "solution", "answer"}
QUERY_KEYS = {"id", "question", "kind", "expect_entry", "answer"}
SCRIPT = {  # every problem/solution/question in these folders must use the script
    "korean": re.compile(r"[\uAC00-\uD7A3]"),  # Hangul syllables
}
HANGUL = SCRIPT["korean"]
LANG_WORDS = {  # every problem/solution/question must contain one of these words
    "italian": "il lo la le gli un una di del della dei che quanto quanta quanti qual quale è e per con in ha sono si",
    "portuguese": "o a os as um uma de do da dos que quanto quanta quantos qual é e em com para por no na são se",
}
LANG_HINT = {
    lang: re.compile(r"(?<!\w)(" + "|".join(re.escape(w) for w in words.split()) + r")(?!\w)", re.I)
    for lang, words in LANG_WORDS.items()
}
ENGLISH_HINT = re.compile(
    r"\b(the|a|an|of|is|are|do|does|what|how|in|for|to|and|with|many|much|which|per|days)\b", re.I
)
ENGLISH_DOMAINS = {"astronomy", "electronics", "cooking", "calendar", "probability", "sql"}
SQL_START = re.compile(r"^(SELECT|UPDATE|INSERT|DELETE|CREATE|WITH)\b")


def check_sql(where, text):
    if not SQL_START.match(text) or not text.rstrip().endswith(";"):
        err(f"{where}: SQL answer must start with a statement keyword and end with ';': {text!r}")


errors = []
warn_same = []


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
            if dom in SCRIPT and not (SCRIPT[dom].search(e["problem"]) and SCRIPT[dom].search(e["solution"])):
                err(f"{where}: expected {dom} script in both problem and solution")
            if dom in LANG_HINT and not LANG_HINT[dom].search(e["problem"]):
                err(f"{where}: problem does not look {dom}")
            if dom in ENGLISH_DOMAINS and not ENGLISH_HINT.search(e["problem"]):
                err(f"{where}: problem does not look English")
            if dom != "korean" and HANGUL.search(e["problem"] + e["solution"]):
                err(f"{where}: Hangul outside the korean domain")
            if dom == "sql":
                if not re.match(r"^Tables? \w+\(", e["problem"]) or "Write an SQL" not in e["problem"]:
                    err(f"{where}: sql problem must state the table schema and ask 'Write an SQL ...'")
                check_sql(where, e["answer"])
                if not e["solution"].endswith(e["answer"]):
                    err(f"{where}: sql solution must be one sentence followed by the query")
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
            if top == "paraphrase" and sub not in PARAPHRASE_KINDS:
                err(f"{where}: paraphrase kind needs a '/how' suffix from {PARAPHRASE_KINDS}")
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
            if dom in LANG_HINT and not LANG_HINT[dom].search(q["question"]):
                err(f"{where}: question does not look {dom}")
            if dom in ENGLISH_DOMAINS and not ENGLISH_HINT.search(q["question"]):
                err(f"{where}: question does not look English")
            if dom != "korean" and HANGUL.search(q["question"]):
                err(f"{where}: Hangul outside the korean domain")
            if dom == "sql" and isinstance(q["answer"], str):
                check_sql(where, q["answer"])
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
            if (
                top != "paraphrase"
                and isinstance(q["answer"], str)
                and q["answer"] in {en["answer"] for en in entries.values()}
            ):
                # a near-miss or uncovered question whose answer equals an entry's answer is suspicious
                # (a near-miss must change the answer); report it so that it is looked at
                warn_same.append(f"{where}: answer {q['answer']!r} equals a library answer")
            if top == "near-miss":
                nms[sub] += 1
            tops[top] += 1
        for eid in entries:
            if para_refs[eid] != PARAS_PER_ENTRY:
                err(f"{q_path}: entry {eid} has {para_refs[eid]} paraphrases, expected {PARAS_PER_ENTRY}")
        for k in NEAR_MISS_KINDS:
            if nms[k] < MIN_PER_NEAR_MISS_KIND:
                err(f"{q_path}: {nms[k]} near-misses of kind {k!r}, expected >= {MIN_PER_NEAR_MISS_KIND}")
        if tops["near-miss"] != NEAR_MISSES_PER_ENTRY * len(entries):
            err(f"{q_path}: {tops['near-miss']} near-misses, expected {NEAR_MISSES_PER_ENTRY} per entry")
        if tops["uncovered"] != UNCOVERED:
            err(f"{q_path}: {tops['uncovered']} uncovered, expected {UNCOVERED}")
        table[dom] = (len(entries), tops["paraphrase"], tops["near-miss"], tops["uncovered"], sum(tops.values()))
        nm_table[dom] = nms
        para_table[dom] = paras

    cols = ["entries", "paraphrase", "near-miss", "uncovered", "queries"]
    print(f"{'domain':<12}" + "".join(f"{c:>11}" for c in cols))
    tot = [0] * len(cols)
    for dom in DOMAINS:
        row = table.get(dom, (0,) * len(cols))
        tot = [a + b for a, b in zip(tot, row)]
        print(f"{dom:<12}" + "".join(f"{v:>11}" for v in row))
    print(f"{'TOTAL':<12}" + "".join(f"{v:>11}" for v in tot))
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
    print(f"{'domain':<12}" + "".join(f"{short[k]:>9}" for k in NEAR_MISS_KINDS))
    nm_tot = Counter()
    for dom in DOMAINS:
        c = nm_table.get(dom, Counter())
        nm_tot.update(c)
        print(f"{dom:<12}" + "".join(f"{c[k]:>9}" for k in NEAR_MISS_KINDS))
    print(f"{'TOTAL':<12}" + "".join(f"{nm_tot[k]:>9}" for k in NEAR_MISS_KINDS))
    print()
    p_tot = Counter()
    for c in para_table.values():
        p_tot.update(c)
    print("paraphrase kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(p_tot.items())))

    if warn_same:
        print("\nnote: near-miss/uncovered answers equal to a library answer (allowed, but check them):")
        for w in warn_same:
            print("  " + w)

    if errors:
        print(f"\n{len(errors)} problem(s):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1
    print("\nOK: all files valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
