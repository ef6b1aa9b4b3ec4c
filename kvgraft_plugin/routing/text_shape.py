"""The shape of a text, read without any vocabulary: script-aware tokens, how many of them another text keeps,
two like spans exchanged, and the arithmetic operators written between numbers.

A judge reads meaning but misses small exchanges: on the held-out domains Qwen2.5-Coder-1.5B let through
"Is Spain to the west of Portugal?" for "Is Portugal to the west of Spain?", "甲比乙大5岁" for "乙比甲大5岁"
and "5x + 7 = 3x + 9" for "5x - 7 = 3x + 9". These are visible in the text's shape alone, in any language,
so the router's structural guards read them here (`kvgraft_plugin.routing.router.swap_guard` and ``operators_guard``).
"""

from __future__ import annotations

import difflib
import re
import sys
import unicodedata
from functools import lru_cache

__all__ = ["Operation", "Swap", "carried", "kept", "operations", "swap", "tokens", "unspaced"]


def _marks() -> str:
    """Every combining mark that ``\\w`` leaves out (Devanagari and Bengali vowel signs, viramas and nuktas,
    accents written apart), as the ranges of a regex class."""
    marks = [c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c))[0] == "M" and not chr(c).isalnum()]
    ranges: list[list[int]] = []
    for c in marks:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return "".join(re.escape(chr(a)) + (f"-{re.escape(chr(b))}" if b > a else "") for a, b in ranges)


#: A number (with its separators: "1,80", "8:15", "2.54"), a word (letters and the marks written on them:
#: "खरीदे" is one word, not "खर" and "द"), or one other visible character.
_TOKEN = re.compile(rf"\d+(?:[.,:]\d+)*|[^\W\d_](?:[^\W\d_]|[{_marks()}])*|[^\w\s]")
#: Scripts written without spaces between words: each character is a token.
_UNSPACED = ("CJK", "HIRAGANA", "KATAKANA")
#: Longest span of an exchange (in tokens): a longer one is a moved clause, which keeps the meaning.
MAX_SPAN = 4
#: Most tokens between the two items of a list (`carried`): "and", "m, a", "goals and", "kişi, Ali'den".
MAX_JOIN = 3


def unspaced(token: str) -> bool:
    """``token`` has a character of a script written without spaces between words (`_UNSPACED`)."""
    return any(unicodedata.name(ch, "").startswith(_UNSPACED) for ch in token)


@lru_cache(maxsize=4096)
def tokens(text: str) -> tuple[str, ...]:
    """Lower-cased words and numbers of ``text``, one per character in scripts written without spaces;
    punctuation and symbols are left out."""
    out: list[str] = []
    for token in _TOKEN.findall(text.lower()):
        if not token[0].isalnum():
            continue
        out.extend(token) if token[0].isalpha() and unspaced(token) else out.append(token)
    return tuple(out)


def kept(first: str, second: str) -> float:
    """The share of the longer text's tokens that the other keeps, in order (1.0: the same tokens)."""
    a, b = tokens(first), tokens(second)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / max(len(a), len(b), 1)


Swap = tuple[str, str]


def _numeric(span: tuple[str, ...]) -> bool:
    return any(t[0].isdigit() for t in span)


def swap(first: str, second: str) -> Swap | None:
    """The two spans exchanged when ``second`` is ``first`` with two like spans swapped (``X A Y B Z`` as
    ``X B Y A Z``), else ``None``.

    Like spans: each of at most `MAX_SPAN` tokens, both with a number or both without ("3 ... 2" for
    "2 ... 3", "Spain ... Portugal" for "Portugal ... Spain"). Adjacent spans count only as single tokens
    ("3/4" for "4/3"): two adjacent clauses moved ("By population, what is..." for "What is ... by
    population?") ask the same thing, and so does a number moved past a phrase ("Von 72 sind 18 wie viel
    Prozent?" for "Wie viel Prozent sind 18 von 72?").

    Two numbers around one word or a written ``+`` or ``*`` ("23 plus 17" for "17 plus 23", "8 + 5" for
    "5 + 8") are not an exchange here: whether that word's operation commutes is a matter of words, which
    the numbers guard (operation words) or the judge reads. Unless the word follows both numbers: that is a
    list of quantities ("1,75 m, 1,62 m" for "1,62 m, 1,75 m"), whose values changed places."""
    found = _swap(first, second)
    return found[:2] if found is not None else None


@lru_cache(maxsize=4096)
def _swap(first: str, second: str) -> tuple[str, str, int] | None:
    """`swap`'s exchange with the number of tokens between its spans."""
    a, b = tokens(first), tokens(second)
    if len(a) != len(b) or a == b:
        return None
    start = next(i for i in range(len(a)) if a[i] != b[i])
    end = len(a) - next(i for i in range(len(a)) if a[-1 - i] != b[-1 - i])
    # A span may begin or end with a token both sides share ("New York" for "New Jersey"): back off a little.
    for lo in range(start, max(start - MAX_SPAN, 0) - 1, -1):
        for hi in range(end, min(end + MAX_SPAN, len(a)) + 1):
            found = _exchange(a[lo:hi], b[lo:hi])
            if found is not None:
                listed = hi < len(a) and found[2] == 1 and a[hi] == a[lo + 1]
                return None if _operands(found, first, second) and not listed else found
    return None


def carried(first: str, second: str) -> bool:
    """``second`` is ``first`` with two listed items in the other order (`swap`'s exchange, its spans at most
    `MAX_JOIN` tokens apart), each span holding a number and a word of its own, one whose first three letters
    no word of the other span shares: "8 kWh by day and 5 kWh at night", "Dawid 128 m, a Piotr 133,5 m",
    "120 sheep and 80 goats". Each value moved with the words that say what it is, so no word took another
    role; whether the order of the list matters ("from 20 kg in May to 30 kg in June") is for a judge to read.
    Values that moved without their names ("152 cm, Sari 1,48 m" between Rina and Sari) are carried too and
    left to the judge; "18 гривень" and "12,50 гривні" (one unit, two inflections) are not carried, nor are
    spans in two clauses ("born on 29 September 1990. How old are they on 15 June")."""
    found = _swap(first, second)
    if found is None or found[2] > MAX_JOIN:
        return False
    spans = [span.split() for span in found[:2]]
    if not all(_numeric(tuple(span)) for span in spans):
        return False
    a, b = ([t for t in span if not t[0].isdigit()] for span in spans)
    return _own_word(a, b) and _own_word(b, a)


def _own_word(span: list[str], other: list[str]) -> bool:
    return any(all(word[:3] != theirs[:3] for theirs in other) for word in span)


def _operands(found: tuple[str, str, int], first: str, second: str) -> bool:
    """The exchanged spans are two numbers around one word, or around a written ``+`` or ``*``."""
    left, right, between = found
    if not (left.replace(",", "").replace(".", "").isdigit() and right.replace(",", "").replace(".", "").isdigit()):
        return False
    commuting = {(left, op, right) for op in "+*"} | {(right, op, left) for op in "+*"}
    return between == 1 or bool(commuting & set(operations(first)) and commuting & set(operations(second)))


def _exchange(x: tuple[str, ...], y: tuple[str, ...]) -> tuple[str, str, int] | None:
    n = len(x)
    for la in range(1, min(MAX_SPAN, n - 1) + 1):
        for lb in range(1, min(MAX_SPAN, n - la) + 1):
            span_a, span_b, between = x[:la], x[n - lb :], x[la : n - lb]
            if span_a == span_b or y != span_b + between + span_a:
                continue
            if _numeric(span_a) != _numeric(span_b) or (not between and la + lb > 2):
                continue
            return " ".join(span_a), " ".join(span_b), len(between)
    return None


#: An arithmetic operator written between two numbers ("5x - 7", "20^2", "17 × 23"), with its operands; a unit's
#: power ("m/s^2") or a dash between words is not one. A number with a variable ("5x") is a number here.
_OPERATION = re.compile(r"(?<![\w.,])(\d+(?:[.,]\d+)*)[a-z]?\s*([-+−–*×x/÷^=<>≤≥])\s*(?=\(?(\d+(?:[.,]\d+)*))")
_SAME = str.maketrans({"−": "-", "–": "-", "×": "*", "x": "*", "÷": "/"})
Operation = tuple[str, str, str]


@lru_cache(maxsize=4096)
def operations(text: str) -> tuple[Operation, ...]:
    """``(left, operator, right)`` for each operator written between numbers in ``text``, in order
    ("5x - 7 = 3x + 9": ``("5", "-", "7")``, ``("7", "=", "3")``, ``("3", "+", "9")``). Minus signs and times
    signs are read as one."""
    return tuple((m.group(1), m.group(2).translate(_SAME), m.group(3)) for m in _OPERATION.finditer(text.lower()))
