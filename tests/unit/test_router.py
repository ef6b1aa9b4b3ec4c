"""The router and each guard, without the LLM: fake embeddings and a fake index."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from kvgraft_plugin.library.template import Entry
from kvgraft_plugin.routing.router import (
    DEFAULT_GUARDS,
    Candidate,
    Match,
    NoMatch,
    Router,
    asked_guard,
    code_guard,
    judged_swap_guard,
    language_guard,
    negation_guard,
    numbers_guard,
    operators_guard,
    prefix_guard,
    relations_guard,
    script_guard,
    swap_guard,
    terms_guard,
    units_guard,
)
from kvgraft_plugin.routing.word_guards import signature, unpaired_numbers


def cand(question: str, problem: str) -> Candidate:
    return Candidate(question, Entry("e", problem, "s"), 0.9, None)


GUARD_CASES = {
    negation_guard: (
        [
            ("Below 50, how many integers aren't prime?", "How many integers below 50 are not prime?"),
            ("How many integers below 50 are prime?", "Count the primes below 50."),
            ("Wie viele Zahlen unter 50 sind keine Primzahlen?", "Wie viele Zahlen unter 50 sind keine Primzahlen?"),
        ],
        [
            ("How many integers below 50 are prime?", "How many integers below 50 are not prime?"),
            ("How many integers below 50 are not prime?", "How many integers below 50 are prime?"),
            ("Which numbers from 1 to 20 are never even?", "Which numbers from 1 to 20 are even?"),
            ("Combien de nombres sous 50 sont premiers ?", "Combien de nombres sous 50 ne sont pas premiers ?"),
            ("Wie viele Zahlen unter 50 sind Primzahlen?", "Wie viele Zahlen unter 50 sind keine Primzahlen?"),
            ("¿Cuántos números menores que 50 no son primos?", "¿Cuántos números menores que 50 son primos?"),
        ],
    ),
    script_guard: (
        [
            ("What is 17 times 23?", "What is 17 times 23?"),
            ("Was ist 17 mal 23? Größer?", "Was ist 17 mal 23? Größer?"),  # Latin letters with umlauts are read
        ],
        [
            ("Сколько будет 17 плюс 23?", "What is 17 times 23?"),  # the word guards see no word in it
            ("Сколько будет 17 плюс 23?", "Сколько будет 17 умножить на 23?"),
            ("17乘以23等于多少？", "What is 17 times 23?"),
            ("What is 17 times 23?", "17加23等于多少？"),  # the entry's side too
            ("What is the force on a 5 Ω resistor?", "What is the force on a 5 Ω resistor?"),
        ],
    ),
    language_guard: (
        [
            ("What is 17 times 23?", "What is 17 times 23?"),
            ("Quick one: 48 × 36 = ?", "Calculate 48 times 36."),  # the English texts farthest from English
            ("Convert 98.6 °F to kelvin.", "Calculate 2^20."),
        ],
        [
            (
                "Dari 40 butir telur yang dibeli, 15% pecah. Berapa butir telur yang pecah?",
                "Dari 40 butir telur yang dibeli, 15% pecah. Berapa butir telur yang tidak pecah?",
            ),  # fmt: skip
            ("Từ 1 đến 50 có bao nhiêu số tự nhiên chia hết cho 3?", "From 1 to 50, how many are divisible by 3?"),
            ("How many integers below 50 are prime?", "Wie viele Zahlen unter 50 sind Primzahlen?"),  # the entry's side
            ("rettangolo 12 per 5 cm, area?", "What is the area of a 12 by 5 cm rectangle?"),
        ],
    ),
    prefix_guard: (
        [
            ("A rectangle is 8 cm long and 5 cm wide.", "A rectangle is 8 cm long and 5 cm wide."),
            ("A 12-volt battery, a 4 ohm resistor.", "A 12 V battery and a 4 ohm resistor."),  # another spelling
            ("I measured 11, 15 and 8 cm.", "They measure 11 cm, 15 cm and 8 cm."),  # a function word after 15
        ],
        [
            ("Ein Rechteck ist 8 m lang und 5 m breit.", "Ein Rechteck ist 8 cm lang und 5 cm breit."),
            ("Через резистор 10 Ом течёт ток 2 мА.", "Через резистор 10 Ом течёт ток 2 А."),
            ("What does a 5 kg mass weigh?", "What does a 5 g mass weigh?"),
        ],
    ),
    numbers_guard: (
        [  # pass
            ("What is 23 times 17?", "What is 17 times 23?"),  # commutative order
            ("What is seventeen times twenty-three?", "What is 17 times 23?"),  # number words
            ("What is the sum of all integers up to 100?", "What is the sum of all integers from 1 to 100?"),
            ("Convert hex 0xFF to decimal.", "What is the hexadecimal number 0xFF in decimal?"),
            ("What is 1,000 divided by 7?", "What is 1000 divided by 7?"),
        ],
        [  # refuse
            ("What is 17 times 24?", "What is 17 times 23?"),
            ("What is -17 times 23?", "What is 17 times 23?"),  # sign
            ("What is 0x17 times 23?", "What is 17 times 23?"),  # another base
            ("What is seventeen times twenty-four?", "What is 17 times 23?"),
            ("What is 20 to the power of 2?", "What is 2 to the power of 20?"),  # order, not commutative
            (
                "A farmer has 3 crates of 24 apples. How many apples?",
                "A farmer has 3 crates of 24 apples and sells 29.",
            ),
        ],
    ),
    code_guard: (
        [
            ("What does 'kvgraft'[::-1] give in Python?", "In Python, what does 'kvgraft'[::-1] evaluate to?"),
            # a function prompt renamed (function and parameters), its examples dropped
            (
                'def rle(s):\n    """Encode runs of s."""',
                'def encode(text):\n    """Encode runs of text: \'aab\' -> \'a2b1\'."""',
            ),
            ('def f(xs, k=2):\n    """Rotate xs by k."""', 'def rotate(items, n=2):\n    """Rotate items by n."""'),
        ],
        [
            # a function prompt with another example, default, or with no trace of an examples-only docstring
            ('def f(s):\n    """Encode: \'aab\' -> \'a2b2\'."""', 'def f(s):\n    """Encode: \'aab\' -> \'a2b1\'."""'),
            ('def f(xs, k=3):\n    """Rotate xs by k."""', 'def f(xs, k=2):\n    """Rotate xs by k."""'),
            ('def f(a, b):\n    """Rotate a by b."""', 'def f(xs, k=2):\n    """Rotate xs by k."""'),
            ('def f(s):\n    """Convert it."""', 'def f(s):\n    """\'parseHttp\' -> \'parse_http\'."""'),
            ("In Python, what is 'kvgraft'[-1]?", "In Python, what does 'kvgraft'[::-1] evaluate to?"),
            ("In Python, what is max(range(3, 30, 4))?", "In Python, what is len(range(3, 30, 4))?"),
            (
                "In Python, what is sum([True, False, False, True])?",
                "In Python, what is sum([True, False, True, True])?",
            ),
            ("In Python, what does 'kvgrafts'[::-1] evaluate to?", "In Python, what does 'kvgraft'[::-1] evaluate to?"),
        ],
    ),
    terms_guard: (
        [
            ("Compute 48 multiplied by 36.", "What is 48 times 36?"),  # synonyms, instruction verbs
            ("Find the LCM of 12 and 18.", "What is the least common multiple of 12 and 18?"),  # abbreviation
            ("Please, quickly: what is 15% of 240?", "What is 15 percent of 240?"),
            (
                "A train covers 180 km in 2.5 hours. What is its average speed in kilometres per hour?",
                "A train travels 180 kilometres in 2.5 hours. What is its average speed in km/h?",
            ),
            # irregular past tense; discourse words (asking, contractions, the problem's form, "together")
            (
                "A farmer had 3 crates of 24 apples and sold 29. How many apples are left?",
                "A farmer has 3 crates of 24 apples and sells 29 apples. How many apples are left?",
            ),
            ("I'd like to know what 17 multiplied by 23 equals.", "What is 17 times 23?"),
            ("Multiply 36 and 48 together.", "What is 48 times 36?"),
            ("Solve the equation 5x - 7 = 3x + 9 for x.", "Solve for x: 5x - 7 = 3x + 9."),
            ("What is binary 101101 written in decimal?", "What is the binary number 101101 in decimal?"),
        ],
        [
            ("What is 17 plus 23?", "What is 17 times 23?"),  # another operation
            # the discourse words leave out negations, comparatives and position words: they change a problem
            ("How many integers below 50 are not prime?", "How many prime numbers are less than 50?"),
            ("What is the last prime below 50?", "How many prime numbers are less than 50?"),
            (
                "A farmer had 3 crates of 24 apples and bought 29 apples. How many apples are there?",
                "A farmer has 3 crates of 24 apples and sells 29 apples. How many apples are left?",
            ),
            ("What is the cube root of 1764?", "What is the square root of 1764?"),  # another concept
            ("What is the binary number 101101 in hexadecimal?", "What is the binary number 101101 in decimal?"),
            ("How many numbers are less than 50?", "How many prime numbers are less than 50?"),  # a concept dropped
            ("What is the sum of all even integers from 1 to 100?", "What is the sum of all integers from 1 to 100?"),
            ("How many seconds are there in one week?", "How many minutes are there in one week?"),  # unit
        ],
    ),
    units_guard: (
        [
            (
                "A farmer sells 29 apples from 3 crates of 24 apples. How many apples are left?",
                "A farmer has 3 crates of 24 apples and sells 29 apples. How many apples are left?",
            )
        ],
        [
            (
                "A farmer has 3 crates of 24 apples and sells 29 crates. How many apples are left?",
                "A farmer has 3 crates of 24 apples and sells 29 apples. How many apples are left?",
            )
        ],
    ),
    swap_guard: (
        [
            ("Is Lyon to the south of Paris?", "Is Lyon to the south of Paris?"),
            ("By area, which is the largest lake in Africa?", "Which is the largest lake in Africa by area?"),
            ("Von 90 sind 30 wie viel Prozent?", "Wie viel Prozent sind 30 von 90?"),  # a number moved, not swapped
            ("Is Paris to the north of Lyon?", "Is Lyon to the south of Paris?"),
        ],
        [
            ("Is Paris to the south of Lyon?", "Is Lyon to the south of Paris?"),
            ("A box 4 cm wide and 9 cm tall: how tall is it?", "A box 9 cm wide and 4 cm tall: how tall is it?"),
            ("丙比丁高3厘米，丁高150厘米，丙多高？", "丁比丙高3厘米，丁高150厘米，丙多高？"),
            (
                "花子は太郎より3歳年上で、太郎は10歳です。花子は何歳？",
                "太郎は花子より3歳年上で、太郎は10歳です。花子は何歳？",
            ),
            (
                "Noon in Oslo (UTC+1) is what time in Lima (UTC−5)?",
                "Noon in Lima (UTC−5) is what time in Oslo (UTC+1)?",
            ),
            ("What is 5/8 of 40?", "What is 8/5 of 40?"),
        ],
    ),
    judged_swap_guard: (
        [
            (
                "A farm keeps 80 goats and 120 sheep. What share are sheep?",
                "A farm keeps 120 sheep and 80 goats. What share are sheep?",
            ),
            (
                "Kamil skoczył 131,5 m, Piotr 133,5 m, a Dawid 128 m.",
                "Kamil skoczył 131,5 m, Dawid 128 m, a Piotr 133,5 m.",
            ),
            ("Is Lyon to the south of Paris?", "Is Lyon to the south of Paris?"),
        ],
        [
            ("Is Paris to the south of Lyon?", "Is Lyon to the south of Paris?"),  # no numbers
            ("A box 9 cm wide and 4 cm tall: how tall is it?", "A box 4 cm wide and 9 cm tall: how tall is it?"),
            (
                "Noon in Lima (UTC−5) is what time in Oslo (UTC+1)?",
                "Noon in Oslo (UTC+1) is what time in Lima (UTC−5)?",
            ),
            (
                "Born on 15 June 1990, how old on 29 September 2025?",
                "Born on 29 September 1990, how old on 15 June 2025?",
            ),
            (
                "Оля купила 4 зошити по 12,50 гривні та ручку за 18 гривень.",
                "Оля купила 4 зошити по 18 гривень та ручку за 12,50 гривні.",
            ),
        ],
    ),
    operators_guard: (
        [
            ("Solve 3y + 4 = 19 for y.", "Find y when 3y + 4 = 19."),
            ("What is 12 × 7?", "What is 12 * 7?"),
            ("Compute 2^10.", "What is 2 to the power of 10?"),
            ("g = 9.8 m/s^2: how far does a stone fall in 2 s?", "How far does a stone fall in 2 s (g = 9.8 m/s²)?"),
        ],
        [
            ("Solve 3y - 4 = 19 for y.", "Find y when 3y + 4 = 19."),
            ("What is 12 + 7?", "What is 12 × 7?"),
            ("Compute 10^2.", "What is 2 to the power of 10?"),
            ("What is 2 to the power of 10?", "Compute 10^2."),  # either side may write it
            ("Divide: 4 / 20.", "How much is 20 divided by 4?"),
            # it fails closed on operands that words name the other way round: the same problem, refused
            ("What is 100 - 37?", "What do you get when you take 37 away from 100?"),
        ],
    ),
    relations_guard: (
        [("Find the sum of the squares of 1 to 40.", "What is the sum of the squares of the integers from 1 to 40?")],
        [
            (
                "What is the square of the sum of the integers from 1 to 40?",
                "What is the sum of the squares of the integers from 1 to 40?",
            )
        ],
    ),
    asked_guard: (
        [
            (
                "Sam's 12 coins are dimes and nickels worth 90 cents. How many of them are dimes?",
                "Sam has 12 coins, all dimes and nickels, worth 90 cents. How many dimes does he have?",
            )
        ],
        [
            (
                "Sam has 12 coins, all dimes and nickels, worth 90 cents. How many nickels does he have?",
                "Sam has 12 coins, all dimes and nickels, worth 90 cents. How many dimes does he have?",
            ),
            (
                "Tom is 3 times as old as Ann. In 10 years he will be twice as old as her. How old is Tom now?",
                "Tom is 3 times as old as Ann. In 10 years he will be twice as old as her. How old is Ann now?",
            ),
        ],
    ),
}


@pytest.mark.parametrize(
    ("guard", "question", "problem", "passes"),
    [
        pytest.param(guard, q, p, ok, id=f"{guard.__name__}-{'pass' if ok else 'refuse'}-{i}")
        for guard, (good, bad) in GUARD_CASES.items()
        for ok, cases in ((True, good), (False, bad))
        for i, (q, p) in enumerate(cases)
    ],
)
def test_guard(guard, question, problem, passes):
    reason = guard(cand(question, problem))
    assert (reason is None) == passes, reason
    if not passes:
        assert isinstance(reason, str) and reason


def test_every_default_guard_has_cases():
    assert {g for _, g in DEFAULT_GUARDS} | {judged_swap_guard} == set(GUARD_CASES)


def test_signature_reads_numbers_in_every_form():
    assert signature("What is -7 // 2?").numbers == (-7.0, 2.0)
    assert signature("What is 2 raised to the 20th power?") == signature("What is 2 to the power of 20?")
    assert signature("Solve 5x - 7 = 3x + 9.").numbers == (5.0, 7.0, 3.0, 9.0)  # binary minus, not a sign
    assert signature("What is sixty-seven times 0xFF, the 15th?").numbers == (67.0, 255.0, 15.0)
    assert "mul" in signature("What is 89 x 47?").key_terms
    assert signature("What is 7!").key_terms == {"factorial"}


def test_a_number_and_a_half_is_read_as_one_number():
    # "half" alone divides by 2; after a number and "and a", it is that number's half (edits-e energy-paraphrase-8).
    assert signature("It charges for one and a half hours.").numbers == (1.5,)
    assert signature("twenty and a half kg, 7 and a half m, 1,000 and a half").numbers == (20.5, 7.5, 1000.5)
    assert unpaired_numbers("It takes 1.5 hours.", "It takes one and a half hours.") == (Counter(), Counter())
    assert signature("Cut it in half.").numbers == (2.0,)
    assert signature("Half of 12 and a half").numbers == (12.5, 2.0)


class FakeIndex:
    """Embeddings are looked up by text; the index returns fixed scores per question."""

    def __init__(self, scores: dict[str, list[tuple[str, float]]]) -> None:
        self.scores = scores
        self.asked: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.asked.extend(texts)
        return np.zeros((len(texts), 4), dtype=np.float32)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        return self.scores[self.asked[-1]][:k]


ENTRIES = {
    "mul": Entry("mul", "What is 17 times 23?", "391"),
    "add": Entry("add", "What is 17 plus 23?", "40"),
    "gcd": Entry("gcd", "What is the greatest common divisor of 84 and 126?", "42"),
}


def router(scores, **kwargs) -> Router:
    fake = FakeIndex(scores)
    return Router(fake.embed, fake.search, ENTRIES, threshold=kwargs.pop("threshold", 0.5), **kwargs)


def test_router_takes_the_first_candidate_that_passes_every_guard():
    # the nearest entry asks another operation; the second one is the same problem
    r = router({"What is 23 plus 17?": [("mul", 0.97), ("add", 0.96), ("gcd", 0.2)]})
    decision = r.route("What is 23 plus 17?")
    assert isinstance(decision, Match) and decision.entry_id == "add"
    refused = [v for v in decision.trail if not v.passed]
    assert [(v.entry_id, v.guard) for v in refused] == [("mul", "terms")]


def test_router_refuses_near_misses_with_the_reason():
    r = router({"What is 17 minus 23?": [("mul", 0.97), ("add", 0.96), ("gcd", 0.2)]})
    decision = r.route("What is 17 minus 23?")
    assert isinstance(decision, NoMatch) and decision.score == 0.97
    assert decision.reason.startswith("mul (score 0.970): the query mentions ['sub']")


Q_MUL = "what is 17 times 23?"  # the entry "mul" in other letters' case: not its exact text


def test_router_threshold_margin_and_hook():
    """(A reworded question: the entry's own text grafts before any of these, `test_exact_text_...`.)"""
    scores = {Q_MUL: [("mul", 0.4), ("add", 0.3)]}
    assert isinstance(router(scores).route(Q_MUL), NoMatch)
    scores = {Q_MUL: [("mul", 0.9), ("add", 0.89)]}
    decision = router(scores, margin=0.05).route(Q_MUL)
    assert isinstance(decision, NoMatch) and "margin" in decision.reason
    seen = []
    hook = lambda q, e, s: seen.append((q, e.id, s)) or False  # noqa: E731
    decision = router(scores, match_check=hook).route(Q_MUL)
    assert isinstance(decision, NoMatch) and seen == [(Q_MUL, "mul", 0.9)]
    assert isinstance(router(scores, guards=()).route(Q_MUL), Match)


def test_explain_lists_every_candidate():
    r = router({"What is 23 plus 17?": [("mul", 0.97), ("add", 0.96), ("gcd", 0.2)]})
    got = r.explain("What is 23 plus 17?")
    assert [(e, s) for e, s, _ in got] == [("mul", 0.97), ("add", 0.96), ("gcd", 0.2)]
    assert got[0][2] is not None and got[1][2] is None and got[2][2] is not None


def test_a_function_prompt_is_read_as_code_examples_and_prose():
    from kvgraft_plugin.library.python_prompt import python_prompt

    prompt = python_prompt('def chunk(items, n=2):\n    """Split items into lists of n: [1, 2, 3] -> [[1, 2], [3]]."""')
    assert prompt is not None and prompt.code == "def func(param_a, param_b=2):\n    pass"
    assert prompt.prose == "Split into lists of" and prompt.examples == {"[1,2,3]->[[1,2],[3]]"}
    assert python_prompt("What is 17 times 23?") is None and python_prompt("x = 1\ndef f(): 'doc'") is None
    # in a docstring, words that change what a function does are key terms: dropping one refuses
    keep = 'def f(items):\n    """Keep repeated items, keeping the first of each."""'
    drop = 'def f(items):\n    """Drop repeated items, keeping the first of each."""'
    assert "drop" in signature(drop).key_terms and "drop" not in signature("Drop the 3 apples.").key_terms
    assert terms_guard(cand(keep, drop)) == "the query leaves out ['drop']"


ADD_Q = "What is 23 plus 17?"  # the nearest entry ("mul") asks another operation: the terms guard refuses it


def test_margin_holds_a_later_candidate_to_the_hit_below_it():
    """A candidate that a guard refused asked another problem: it is no rival of the candidates after it."""
    r = router({ADD_Q: [("mul", 0.97), ("add", 0.96), ("gcd", 0.2)]}, margin=0.05)
    decision = r.route(ADD_Q)
    assert isinstance(decision, Match) and decision.entry_id == "add"
    assert [(v.entry_id, v.guard) for v in decision.trail if not v.passed] == [("mul", "terms")]
    assert [(entry_id, reason) for entry_id, _, reason in r.explain(ADD_Q)][1] == ("add", None)  # as route sees it
    # ... and still refused when the hit below it is as close
    near = router({ADD_Q: [("mul", 0.97), ("add", 0.96), ("gcd", 0.94)]}, margin=0.05).route(ADD_Q)
    assert isinstance(near, NoMatch) and near.reason.startswith("mul (score 0.970)")
    assert [(v.entry_id, v.reason) for v in near.trail if v.guard == "margin"] == [
        ("add", "within margin 0.05 of another entry (0.960 vs 0.940)")
    ]


def test_a_candidate_refused_by_the_margin_alone_still_competes():
    """Two entries that both pass the guards and score within the margin are ambiguous: neither grafts
    (taking the second would graft the one the question is further from)."""
    entries = {**ENTRIES, "mul2": Entry("mul2", "Compute 17 multiplied by 23.", "391")}
    fake = FakeIndex({Q_MUL: [("mul", 0.90), ("mul2", 0.89), ("gcd", 0.2)]})
    r = Router(fake.embed, fake.search, entries, threshold=0.5, margin=0.05)
    decision = r.route(Q_MUL)
    assert isinstance(decision, NoMatch) and "margin" in decision.reason
    assert [(v.entry_id, v.reason) for v in decision.trail if v.guard == "margin"] == [
        ("mul", "within margin 0.05 of another entry (0.900 vs 0.890)"),
        ("mul2", "within margin 0.05 of another entry (0.890 vs 0.900)"),
    ]
    assert isinstance(Router(fake.embed, fake.search, entries, threshold=0.5).route(Q_MUL), Match)


def test_the_last_candidate_has_a_runner_up_too():
    """The index is asked for one hit more than the candidates, so the margin never passes for want of one."""
    fake = FakeIndex({ADD_Q: [("mul", 0.97), ("add", 0.96), ("gcd", 0.95)]})
    asked_k: list[int] = []

    def search(vector, k):
        asked_k.append(k)
        return fake.search(vector, k)

    decision = Router(fake.embed, search, ENTRIES, threshold=0.5, margin=0.05, neighbors=2).route(ADD_Q)
    assert asked_k == [3] and isinstance(decision, NoMatch)
    assert [v.reason for v in decision.trail if v.guard == "margin"] == [
        "within margin 0.05 of another entry (0.960 vs 0.950)"
    ]


def test_explain_skips_index_ids_the_manifest_lacks_as_route_does():
    """An index read mid-prune may name an entry the manifest no longer has."""
    r = router({ADD_Q: [("gone", 0.99), ("mul", 0.97), ("add", 0.96), ("gcd", 0.2)]})
    assert [(e, s) for e, s, _ in r.explain(ADD_Q)] == [("mul", 0.97), ("add", 0.96), ("gcd", 0.2)]
    assert r.route(ADD_Q).entry_id == "add"  # type: ignore[union-attr]
    only_gone = router({ADD_Q: [("gone", 0.99)]})
    assert only_gone.explain(ADD_Q) == []
    assert only_gone.route(ADD_Q).reason == "the index lists no entry of the manifest"  # type: ignore[union-attr]
    assert router({ADD_Q: []}).explain(ADD_Q) == []


def test_number_words_read_as_values_and_one_alone_is_no_number():
    from kvgraft_plugin.routing.word_guards import signature

    # "twenty-one" raised KeyError (a units word after a tens word was looked up among the words read alone)
    assert signature("There are thirty-one days and twenty one nights.").numbers == (31.0, 21.0)
    assert signature("ninety-nine and nine, seventeen").numbers == (99.0, 9.0, 17.0)
    assert signature("three-four times").numbers == (3.0, 4.0)  # two numbers, not 7
    assert signature("Which one of them is larger?").numbers == ()
