"""The structural signature of a problem statement: what must be equal for two texts to ask the same thing.

Embeddings see two problems that share their numbers and most of their words as near-identical (MiniLM
scores "17 plus 23" against "17 times 23" at 0.9+), so the router compares signatures as well:

- ``numbers``: every number with its sign and value, whether written in digits, words, hex or as an
  ordinal ("-7", "seventeen", "0x17", "15th");
- ``terms``: content words, after synonyms and abbreviations are mapped to one canonical term
  ("multiplied by" / "times" / "x" -> ``mul``, "km/h" / "kilometres per hour" -> ``kmh``, "GCD" ->
  ``gcd``) and filler words ("please", "compute", "what is") are dropped;
- ``key_terms``: the terms that name an operation, a concept, a unit or a code literal (the canonical
  vocabulary below): dropping one of them changes the problem, dropping a filler word does not;
- ``code``: code literals that must match as written (slices, called functions, booleans, string
  literals, operators);
- ``asked``: the terms of the question sentence (the quantity asked for).

A problem that is a Python function prompt (a signature and a docstring, `python_prompt`) is read as
code and prose apart: the function's and its parameters' names are replaced by placeholders (a renamed
function asks the same task), the code without its docstring must match as written (``code``), the
docstring's example clauses (``'aaab' -> 'a3b1'``, ``f(2) == 4``) are kept whole as ``examples`` (a query
may drop examples, not change them), and only the docstring's prose goes through the reading above.

The router's guards compare two signatures; this module only extracts them (no model needed).
"""

from __future__ import annotations

import dataclasses
import decimal
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from kvgraft_plugin.library.python_prompt import COMMON_WORDS, python_prompt

__all__ = [
    "IMPLIED_NUMBERS",
    "KEY_TERMS",
    "ORDERED",
    "Signature",
    "signature",
    "unpaired_numbers",
]

# Phrases mapped to one canonical term, applied in order to lower-cased text (longest phrases first).
_PHRASES: tuple[tuple[str, str], ...] = (
    (r"\bkm\s*/\s*h\b|\bkph\b|\bkilomet(?:re|er)s? (?:per|an|a) hour\b", " kmh "),
    (r"\bm\s*/\s*s\b|\bmet(?:re|er)s? (?:per|a) second\b", " mps "),
    (r"\bmph\b|\bmiles? (?:per|an|a) hour\b", " mph "),
    (r"\bsquare (?:cm|centimet(?:re|er)s?)\b|\bcm\s*(?:2|²|\^2)\b", " cm2 "),
    (r"\bsquare (?:m|met(?:re|er)s?)\b|\bm\s*(?:2|²|\^2)\b", " m2 "),
    (r"\bgreatest common (?:divisor|factor)\b|\bhighest common factor\b|\bgcd\b|\bhcf\b|\bgcf\b", " gcd "),
    (r"\b(?:least|lowest|smallest) common multiple\b|\blcm\b", " lcm "),
    (r"\bsquare roots?\b|\bsqrt\b|√", " sqrt "),
    (r"\bcube roots?\b|\bcbrt\b", " cbrt "),
    (r"\b(?:raised )?to the (\d+)(?:st|nd|rd|th) power\b", " pow \\1 "),
    (r"\bto the power of\b|\braised to(?: the power of)?\b|\*\*|\^", " pow "),
    (r"\bworst[- ]case\b|\bin the worst case\b|\bat most\b", " worst "),
    (r"\bbest[- ]case\b|\bin the best case\b", " best "),
    (r"\bcompounded\b|\bcompound\b", " compound "),
    (r"\bper ?cent\b|(?<=\d)%", " percent "),
    (r"\bin total\b|\baltogether\b|\bin all\b", " "),
    (r"(?<![\w.])-?0x(?=[0-9a-f]+\b)", " hex \\g<0>"),
    (r"(?<![\w.])-?0b(?=[01]+\b)", " binary \\g<0>"),
    (r"(?<=\d)!", " factorial "),
    (r"\bo'?clock\b", " :00 "),
    (r"\bwhole numbers?\b|\bintegers?\b", " integer "),
    (r"\bprime numbers?\b|\bprimes?\b", " prime "),
    (r"\bless than\b|\bbelow\b|\bsmaller than\b|\bfewer than\b|\bunder\b|<(?!=)", " lt "),
    (r"\bgreater than\b|\bmore than\b|\babove\b|\blarger than\b|\bbigger than\b|>(?!=)", " gt "),
    (r"\bmultipl(?:y|ied|ies|ying)(?: by)?\b|\btimes\b|\bproduct\b|×|(?<=\d)\s+x\s+(?=[-\d])|\*", " mul "),
    (r"\bdivid(?:e|ed|es|ing)(?: by)?\b|÷", " div "),
    (r"//", " floordiv "),
    (r"(?<=[\d\w)])\s*/\s*(?=[\d\w(])", " div "),
    (r"\bplus\b|\badd(?:ed)?(?: up)?\b|\bsum\b|\btotal\b|\+", " add "),
    (r"\bminus\b|\bsubtract(?:ed)?\b|(?<=[\w)])\s+-\s+(?=[\w(])", " sub "),
    (r"\bremainder\b|\bmodulo\b|\bmod\b|%", " mod "),
    (r"\baverage\b|\bmean\b", " mean "),
)

# Single words mapped to a canonical term (after light stemming).
_SYNONYMS: dict[str, str] = {
    "squared": "square",
    "cubed": "cube",
    "hexadecimal": "hex",
    "kilometre": "km",
    "kilometer": "km",
    "centimetre": "cm",
    "centimeter": "cm",
    "metre": "m",
    "meter": "m",
    "hr": "hour",
    "min": "minute",
    "sec": "second",
    "usd": "dollar",
    "remain": "left",
    "remaining": "left",
    "leftover": "left",
    "go": "travel",
    "goe": "travel",  # "goes" after plural stripping
    "cover": "travel",
    "drive": "travel",
    "wide": "width",
    "tall": "height",
    "high": "height",
    "fib": "fibonacci",
    "comparison": "compare",
    "shake": "handshake",
    "discounted": "discount",
    "sale": "discount",
    "off": "discount",
    "price": "cost",
    "priced": "cost",
    "old": "age",
    "evaluate": "",
    "give": "",
    "return": "",
    "returns": "",
}

# Canonical terms that name an operation, a concept, a unit or a condition: the words that change a problem.
KEY_TERMS: frozenset[str] = frozenset(
    """mul div floordiv add sub mod pow sqrt cbrt square cube factorial percent gcd lcm prime even odd
    fibonacci digit mean median mode range max min lt gt worst best area perimeter circumference volume
    diameter radius hypotenuse leg angle degree radian binary hex decimal octal kmh mps mph km cm cm2 m m2
    hour minute second day week year dollar cent compound simple interest balance left sell buy
    speed length width height age discount cost reverse upper lower sort len
    fraction triangular perfect quotient""".split()
)

#: Operations whose operands cannot be swapped: "2 to the power of 20" is not "20 to the power of 2".
ORDERED: frozenset[str] = frozenset({"sub", "div", "floordiv", "mod", "pow", "lt", "gt", "percent"})

_NUMBER_WORDS: dict[str, int] = {
    w: i
    for i, w in enumerate(
        "zero _ two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen".split()
    )
    if w != "_"
}
_NUMBER_WORDS.update(
    {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i > 1}
)
_ORDINAL_WORDS = {
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
    "twice": 2,
    "half": 2,
    "thrice": 3,
    "double": 2,
    "triple": 3,
}
_ORDINAL_TERMS = {"twice": "mul", "double": "mul", "thrice": "mul", "triple": "mul", "half": "div"}

_STRING_LITERAL = re.compile(r"(?<!\w)'[^'\n]*'(?!\w)|(?<!\w)\"[^\"\n]*\"(?!\w)")  # not possessives
_SLICE = re.compile(r"\[[^\[\]\n]{0,40}\]")
_CALL = re.compile(r"(?<!def )\b([A-Za-z_][A-Za-z_0-9]*)\(")  # "water (H2O)" is no call
_INDEX = re.compile(r"\[\s*-?\d+\s*\]")
_BOOL = re.compile(r"\b(True|False|None)\b")
# A number starts after no ASCII letter, digit or point: "h2o" holds none, "17乘以23" and "17плюс23" two.
_HEX = re.compile(r"(?<![a-z0-9_.])(-?)0x([0-9a-f]+)\b")
_ONES = {w: i for i, w in enumerate("_ one two three four five six seven eight nine".split()) if i}
#: "twenty-one" is 21 (a units word only after a tens word: "one" alone is a pronoun, "three-four" two numbers).
_WORD_NUMBER = re.compile(
    r"\b(?:(" + "|".join(w for w, v in _NUMBER_WORDS.items() if v >= 20) + r")(?:[- ](" + "|".join(_ONES) + r"))?"
    r"|(" + "|".join(sorted((w for w, v in _NUMBER_WORDS.items() if v < 20), key=len, reverse=True)) + r"))\b"
)
_NUMBER = re.compile(r"(?<![a-z0-9_.])(-?)(\d+(?:,\d{3})*(?:\.\d+)?)(?:st|nd|rd|th)?(?![\d])")
#: "one and a half", "2 and a half": the number and 0.5 ("half" alone is read as the 2 it divides by).
_AND_A_HALF = re.compile(
    r"(?<![a-z0-9_.,])("
    + "|".join(sorted([*_NUMBER_WORDS, *_ONES], key=len, reverse=True))
    + r"|\d+(?:,\d{3})*) and a half\b"
)
#: 1.5e8, 1.5e-3, 3.0 x 10^8, 3.0 × 10^8: one number each.
_SCIENTIFIC = re.compile(r"(?<![a-z0-9_.])(-?)(\d+(?:\.\d+)?)(?:e([-+]?\d+)|\s*[x×*]\s*10\^([-+]?\d+))(?![\d])")
#: A power written on a unit (cm^3, m/s^2) belongs to that word: "cm^3" is "cm³", not "cm and 3".
_POWER = re.compile(r"(?<=[a-z]{2}|/[a-z])\^(\d+)")
_SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _notation(text: str) -> str:
    """Scientific numbers as decimals and unit powers as superscripts, before the phrase rewrites read "^"."""
    text = _SCIENTIFIC.sub(
        lambda m: m.group(1) + _decimal(float(m.group(2)) * 10.0 ** int(m.group(3) or m.group(4))), text
    )
    return _POWER.sub(lambda m: m.group(1).translate(_SUPERSCRIPTS), text)


def _decimal(value: float) -> str:
    """``value`` in plain decimal digits, however small or large (1.5e-15 is not 0)."""
    return format(decimal.Decimal(repr(value)), "f")


_TOKEN = re.compile(r"#[a-j]+|[a-z][a-z0-9_']*")
_MARK = re.compile(r"#[a-j]+")


@dataclass(frozen=True)
class Signature:
    """What a problem statement asks, reduced to comparable parts (see the module docstring)."""

    numbers: tuple[float, ...]
    """Numbers in the order they appear."""
    terms: frozenset[str]
    key_terms: frozenset[str]
    code: tuple[str, ...]
    """Code literals, sorted (a multiset)."""
    asked: frozenset[str]
    """Terms of the question sentence."""
    quantities: frozenset[tuple[float, str]]
    """(number, the word right after it): "29 apples" is not "29 crates"."""
    relations: frozenset[tuple[str, str]]
    """(X, Y) for "X of (the) Y": "the sum of the squares" is not "the square of the sum"."""
    target: str | None
    """What "how many ..." counts: the first term after it ("how many cents" is not "how many dimes")."""
    examples: frozenset[str] = frozenset()
    """A Python prompt's docstring examples, whitespace removed, names as placeholders."""

    @property
    def function_prompt(self) -> bool:
        """The text is a Python function prompt (`python_prompt`): its code is among ``code``."""
        return any(literal.startswith("code:") for literal in self.code)

    @property
    def number_counts(self) -> Counter[float]:
        """``numbers`` as a multiset."""
        return Counter(self.numbers)


#: Numbers a question may leave out of an entry's without changing the problem ("from 1 to 100" ~ "up to 100").
IMPLIED_NUMBERS = frozenset({0.0, 1.0})


def unpaired_numbers(problem: str, question: str) -> tuple[Counter[float], Counter[float]]:
    """The numbers ``question`` has that ``problem`` lacks, and those of ``problem`` it lacks (but for
    `IMPLIED_NUMBERS`), each value as often as it is unpaired, however written."""
    asked, given = signature(question).number_counts, signature(problem).number_counts
    missing = Counter({n: k for n, k in (given - asked).items() if n not in IMPLIED_NUMBERS})
    return asked - given, missing


def _code_literals(text: str) -> list[str]:
    """String literals, slices (numbers kept), called function names and booleans, as written."""
    out = [f"str:{m}" for m in _STRING_LITERAL.findall(text)]
    slices = (m for m in _SLICE.findall(text) if ":" in m or _INDEX.fullmatch(m))
    out += ["slice:" + "".join(m.split()) for m in slices]
    out += [f"call:{m}" for m in _CALL.findall(text)]
    out += [f"bool:{m}" for m in _BOOL.findall(text)]
    return out


#: Irregular past forms of common verbs, mapped to the present ("sold" asks what "sells" asks).
_IRREGULAR: dict[str, str] = {
    past: verb
    for verb, forms in (
        ("sell", "sold"), ("buy", "bought"), ("pay", "paid"), ("spend", "spent"), ("give", "gave given"),
        ("take", "took taken"), ("make", "made"), ("write", "wrote written"), ("run", "ran"),
        ("drive", "drove driven"), ("go", "went gone"), ("get", "got gotten"), ("have", "had"),
        ("meet", "met"), ("keep", "kept"), ("find", "found"), ("think", "thought"), ("hold", "held"),
        ("grow", "grew grown"), ("ride", "rode ridden"), ("fly", "flew flown"), ("eat", "ate eaten"),
        ("build", "built"), ("shake", "shook shaken"), ("win", "won"), ("lose", "lost"),
        ("begin", "began begun"), ("say", "said"), ("tell", "told"), ("know", "knew known"),
        ("see", "saw seen"), ("come", "came"), ("become", "became"), ("rise", "rose risen"),
        ("fall", "fell fallen"), ("lend", "lent"), ("draw", "drew drawn"), ("throw", "threw thrown"),
        ("send", "sent"), ("stand", "stood"), ("sit", "sat"), ("bring", "brought"), ("catch", "caught"),
        ("teach", "taught"), ("swim", "swam swum"), ("choose", "chose chosen"), ("break", "broke broken"),
    )
    for past in forms.split()
}  # fmt: skip


def _stem(word: str) -> str:
    """Light stemming: possessive, irregular verbs, plural, -ing and -ed (rounding / rounded -> round), then
    synonyms."""
    word = word.strip("'")
    if word.endswith("'s"):
        word = word[:-2]
    word = _IRREGULAR.get(word, word)
    if word in _SYNONYMS:
        return _SYNONYMS[word]
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 4 and word.endswith(("ches", "shes", "sses", "xes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    elif len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 5 and word.endswith("ed"):
        word = word[:-2]
    return _SYNONYMS.get(word, word)


def _half_past(number: str) -> float:
    return float(number.replace(",", "")) + 0.5 if number[0].isdigit() else {**_ONES, **_NUMBER_WORDS}[number] + 0.5


def _numbers_and_rest(text: str) -> tuple[dict[str, float], str]:
    """Pull every number out of lower-cased ``text``: return the text with each replaced by a marker
    ``#<letters>`` (so that the word after it can be bound to it as its unit), and each marker's value."""
    values: dict[str, float] = {}

    def take(value: float) -> str:
        mark = "#" + "".join(chr(ord("a") + int(d)) for d in str(len(values)))  # no digits: not re-read
        values[mark] = value
        return f" {mark} "

    text = _HEX.sub(lambda m: take((-1 if m.group(1) else 1) * int(m.group(2), 16)), text)
    text = _AND_A_HALF.sub(lambda m: take(_half_past(m.group(1))), text)
    text = _WORD_NUMBER.sub(
        lambda m: take(
            _NUMBER_WORDS[m.group(3)] if m.group(3) else _NUMBER_WORDS[m.group(1)] + _ONES.get(m.group(2) or "", 0)
        ),
        text,
    )
    text = _NUMBER.sub(lambda m: take((-1 if m.group(1) else 1) * float(m.group(2).replace(",", ""))), text)
    return values, text


@dataclass
class _Scan:
    terms: list[str] = field(default_factory=list)
    implied: list[float] = field(default_factory=list)
    units: list[tuple[str, str]] = field(default_factory=list)
    relations: list[tuple[str, str]] = field(default_factory=list)


def _scan(text: str) -> _Scan:
    """Canonical content terms of marked-up text, with numbers implied by words, the unit word right after
    each number (``#<letters>``), and "X of Y" relations between consecutive terms."""
    out = _Scan()
    pending_number: str | None = None
    last_term: str | None = None
    saw_of = False
    for token in _TOKEN.findall(text):
        if token.startswith("#"):
            pending_number, last_term = token, None
            continue
        if token in _ORDINAL_WORDS:
            out.implied.append(float(_ORDINAL_WORDS[token]))
            token = _ORDINAL_TERMS.get(token, "")
            if not token:
                continue
        stem = _stem(token)
        if not stem or stem in COMMON_WORDS or token in COMMON_WORDS:
            saw_of = saw_of or token == "of"
            pending_number = None
            continue
        out.terms.append(stem)
        if pending_number is not None:
            out.units.append((pending_number, stem))
            pending_number = None
        if last_term is not None and saw_of:
            out.relations.append((last_term, stem))
        last_term, saw_of = stem, False
    return out


#: Words that change what a function does, key terms in a docstring's prose only (in a word problem
#: "keep" or "count" is filler). Found by the code routing set's tuning half: "Keep repeated items" grafted
#: the entry "Drop repeated items" while "drop" was an ordinary word.
_CODE_KEY_WORDS = """keep keeping kept drop dropping dropped remove removing removed skip skipping skipped ignore
    ignoring ignored include including exclude excluding encode decode split join merge reverse reversed count
    last smallest largest shortest longest increasing decreasing ascending descending start end before after
    unique duplicate duplicates distinct sorted right""".split()


@lru_cache(maxsize=4096)
def signature(text: str) -> Signature:
    """The signature of a problem statement or query (a Python function prompt: see `python_prompt`)."""
    text = unicodedata.normalize("NFKC", text)
    prompt = python_prompt(text)
    if prompt is not None:
        prose = signature(prompt.prose)
        return dataclasses.replace(
            prose,
            key_terms=prose.key_terms | (prose.terms & _code_key_terms()),
            code=tuple(sorted((*prose.code, f"code:{prompt.code}"))),
            examples=prompt.examples,
        )
    code = sorted(_code_literals(text))
    text = _notation(_STRING_LITERAL.sub(" ", text).lower())
    for pattern, canonical in _PHRASES:
        text = re.sub(pattern, canonical, text)
    values, rest = _numbers_and_rest(text)
    numbers = [values[m] for m in _MARK.findall(rest)]
    sentences = [s for s in re.split(r"(?<=[.?!])\s+|:\s+(?=[a-z])", rest.strip()) if re.search(r"[a-z]", s)]
    asked_text = next((s for s in reversed(sentences) if "?" in s), sentences[-1] if sentences else "")
    scan = _scan(rest)
    return Signature(
        numbers=tuple(numbers + scan.implied),
        terms=frozenset(scan.terms),
        key_terms=frozenset(t for t in scan.terms if t in KEY_TERMS),
        code=tuple(code),
        asked=frozenset(_scan(asked_text).terms),
        quantities=frozenset((values[mark], unit) for mark, unit in scan.units),
        relations=frozenset(scan.relations),
        target=_target(rest),
    )


@lru_cache(maxsize=1)
def _code_key_terms() -> frozenset[str]:
    return frozenset(_stem(w) for w in _CODE_KEY_WORDS)


def _target(text: str) -> str | None:
    found = re.search(r"\bhow many\b(.*)", text)
    if not found:
        return None
    terms = _scan(found.group(1)).terms
    return terms[0] if terms else None
