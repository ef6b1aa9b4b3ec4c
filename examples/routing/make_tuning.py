"""Generate `tuning.jsonl`: the part of the routing suite the router is tuned on.

Method (unlike the hand-written held-out part): every query is a mechanical edit of an entry's problem.
- paraphrases: two generic rewrites of the problem (a lead-in / filler phrase, and an imperative verb
  instead of "What is"), plus an operand swap where the operation is commutative;
- near-misses: one word or literal of the problem swapped for another (a table per entry below), with
  the answer of the edited problem;
- repeats: every problem verbatim.
Run: python examples/routing/make_tuning.py > examples/routing/tuning.jsonl
"""

import json
import re
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1] / "library.jsonl"

# entry id -> [(old text, new text, answer of the edited problem, kind), ...]
SWAPS: dict[str, list[tuple[str, str, str, str]]] = {
    "mul-17x23": [
        ("times", "plus", "40", "operation"),
        ("times", "minus", "-6", "operation"),
        ("17", "-17", "-391", "number-form"),
    ],
    "mul-48x36": [
        ("times", "plus", "84", "operation"),
        ("times", "minus", "12", "operation"),
        ("48", "forty-nine", "1764", "number-form"),
    ],
    "mul-125x16": [
        ("times", "divided by", "7.8125", "operation"),
        ("times", "plus", "141", "operation"),
        ("125", "0x125", "4672", "number-form"),
    ],
    "mul-89x47": [
        ("times", "minus", "42", "operation"),
        ("times", "plus", "136", "operation"),
        ("89", "-89", "-4183", "number-form"),
    ],
    "mul-234x19": [
        ("times", "plus", "253", "operation"),
        ("times", "minus", "215", "operation"),
        ("19", "nineteen squared", "84474", "operation"),
    ],
    "mul-67x89": [
        ("times", "plus", "156", "operation"),
        ("times", "minus", "-22", "operation"),
        ("67", "sixty-eight", "6052", "number-form"),
    ],
    "sum-1-to-100": [
        ("sum", "product", "100!", "operation"),
        ("sum of all integers", "number of integers", "100", "asked"),
        ("integers", "multiples of 3", "1683", "condition"),
    ],
    "sum-1-to-50": [
        ("sum of all integers", "number of integers", "50", "asked"),
        ("sum", "average", "25.5", "operation"),
        ("integers", "odd integers", "625", "condition"),
    ],
    "sum-10-to-30": [
        ("sum", "average", "20", "operation"),
        ("integers", "even integers", "220", "condition"),
        ("sum of all integers", "count of integers", "21", "asked"),
    ],
    "sqrt-1764": [
        ("square root", "square", "3111696", "concept"),
        ("square root", "cube", "5489031744", "concept"),
        ("square root", "half", "882", "concept"),
    ],
    "pow-2-20": [
        ("2 to the power of 20", "20 to the power of 2", "400", "operation"),
        ("power of", "multiple of", "40", "operation"),
        ("2 to the", "3 to the", "3486784401", "number-form"),
    ],
    "gcd-84-126": [
        ("greatest common divisor", "least common multiple", "252", "concept"),
        ("greatest", "smallest", "1", "concept"),
        ("divisor", "multiple", "none", "concept"),
    ],
    "lcm-12-18": [
        ("least common multiple", "greatest common divisor", "6", "concept"),
        ("least", "second least", "72", "condition"),
        ("multiple", "divisor", "1", "concept"),
    ],
    "primes-below-50": [
        ("prime", "even", "24", "concept"),
        ("less than", "greater than 40 and less than", "2", "condition"),
        ("prime numbers", "perfect squares", "7", "concept"),
    ],
    "factorial-7": [
        ("7 factorial", "7 squared", "49", "concept"),
        ("7 factorial", "7 cubed", "343", "concept"),
        ("7 factorial", "the factorial of 7, divided by 7", "720", "operation"),
    ],
    "percent-15-of-240": [
        ("percent of", "percent more than", "276", "operation"),
        ("percent of", "percent less than", "204", "operation"),
        ("15 percent", "15 times", "3600", "operation"),
    ],
    "fib-15": [
        ("Fibonacci", "prime", "47", "concept"),
        ("Fibonacci", "triangular", "120", "concept"),
        ("15th Fibonacci number", "sum of the first 15 Fibonacci numbers", "1596", "asked"),
    ],
    "digits-sum-2-15": [
        ("sum", "product", "2016", "operation"),
        ("sum of the digits", "number of digits", "5", "asked"),
        ("power of 15", "power of 15, minus 1", "33", "operation"),
    ],
    "div-remainder": [
        ("remainder", "quotient", "142", "asked"),
        ("divided by 7", "multiplied by 7", "0", "operation"),
        ("remainder", "rounded quotient", "143", "asked"),
    ],
    "apples-train": [
        ("sells", "buys", "101", "operation"),
        ("How many apples are left", "How many apples did he sell", "29", "asked"),
        ("sells 29 apples", "sells 29 crates", "none", "unit"),
    ],
    "train-speed": [
        ("km/h", "m/s", "20", "unit"),
        ("average speed", "travel time per kilometre", "1/72 h", "asked"),
        ("km/h", "miles per hour", "44.74", "unit"),
    ],
    "pencils-cost": [
        ("How many cents do 12 pencils cost", "How many dollars do 12 pencils cost", "4.20", "unit"),
        ("cents each", "cents per dozen", "35", "condition"),
        ("How many cents do 12 pencils cost", "How many pencils do 12 dollars buy", "34", "asked"),
    ],
    "age-puzzle": [
        ("How old is Ann now", "How old is Tom now", "30", "asked"),
        ("3 times as old", "3 years older", "none", "condition"),
        ("How old is Ann now", "How old will Ann be in 10 years", "20", "asked"),
    ],
    "rectangle-area": [
        ("area in square cm", "length in cm", "10", "asked"),
        ("area in square cm", "diagonal in cm", "11.18", "asked"),
        ("perimeter", "area", "6", "concept"),
    ],
    "workers-days": [
        ("15 workers need", "15 workers need to build 2 walls", "8", "condition"),
        ("how many days do 15 workers need", "how many worker-days does the wall take", "60", "asked"),
        ("the same rate", "half the rate", "8", "condition"),
    ],
    "discount-price": [
        ("new price", "discount", "20", "asked"),
        ("discounted by", "increased by", "100", "operation"),
        ("new price in dollars", "new price in cents", "6000", "unit"),
    ],
    "handshakes-10": [
        ("shake hands once", "shake hands twice", "90", "condition"),
        ("How many handshakes are there", "How many handshakes does each person make", "9", "asked"),
        ("Ten", "Eleven", "55", "number-form"),
    ],
    "triangle-hypotenuse": [
        ("How long is the hypotenuse", "What is its area", "54", "asked"),
        ("How long is the hypotenuse", "What is its perimeter", "36", "asked"),
        ("right triangle", "isosceles triangle", "none", "concept"),
    ],
    "circle-area-r7": [
        ("area", "circumference", "44", "concept"),
        ("radius 7", "diameter 7", "38.5", "concept"),
        ("area of a circle", "area of a semicircle", "77", "concept"),
    ],
    "clock-angle-3": [
        ("degrees", "radians", "pi/2", "unit"),
        ("3:00", "3:30", "75", "number-form"),
        ("between the hands", "swept by the minute hand", "none", "concept"),
    ],
    "minutes-in-week": [
        ("minutes", "seconds", "604800", "unit"),
        ("minutes", "hours", "168", "unit"),
        ("one week", "one day", "1440", "unit"),
    ],
    "coins-mix": [
        ("How many dimes does he have", "How many cents are his nickels worth", "30", "asked"),
        ("dimes and nickels", "dimes and quarters", "none", "concept"),
        ("worth 90 cents", "worth 90 dollars", "none", "unit"),
    ],
    "linear-eq": [
        ("5x - 7", "5x + 7", "1", "code-literal"),
        ("3x + 9", "3x - 9", "-1", "code-literal"),
        ("= 3x", "= -3x", "2", "code-literal"),
    ],
    "avg-test-scores": [
        ("average", "median", "87.5", "concept"),
        ("average", "range", "21", "concept"),
        ("average", "sum", "340", "operation"),
    ],
    "py-reverse-string": [
        ("[::-1]", "[::2]", "kgat", "code-literal"),
        ("[::-1]", "[1:]", "vgraft", "code-literal"),
        ("[::-1]", "[-1]", "t", "code-literal"),
    ],
    "py-len-range": [
        ("len(range", "sum(range", "105", "code-literal"),
        ("len(range", "max(range", "27", "code-literal"),
        ("range(3", "range(-3", "9", "code-literal"),
    ],
    "py-list-sum-comp": [
        ("x * x", "x + x", "20", "code-literal"),
        ("sum(", "max(", "16", "code-literal"),
        ("x * x", "x ** 3", "100", "code-literal"),
    ],
    "py-int-div": [
        ("//", "%", "1", "code-literal"),
        ("-7", "7", "3", "code-literal"),
        ("//", "/", "-3.5", "code-literal"),
    ],
    "py-bool-sum": [
        ("True, False, True, True", "True, False, False, True", "2", "code-literal"),
        ("sum(", "any(", "True", "code-literal"),
        ("sum(", "all(", "False", "code-literal"),
    ],
    "binary-101101": [
        ("in decimal", "in hexadecimal", "2D", "unit"),
        ("binary", "octal", "33345", "number-form"),
        ("101101", "101111", "47", "number-form"),
    ],
    "hex-ff": [
        ("in decimal", "in binary", "11111111", "unit"),
        ("0xFF", "0xFE", "254", "number-form"),
        ("hexadecimal number 0xFF", "octal number 077", "63", "number-form"),
    ],
    "big-o-binary-search": [
        ("binary search", "linear search", "1024", "concept"),
        ("worst-case", "best-case", "1", "condition"),
        ("sorted list", "sorted list of twice as many", "12", "condition"),
    ],
    "sum-squares-1-40": [
        ("squares", "cubes", "672400", "concept"),
        ("sum of the squares", "square of the sum", "672400", "operation"),
        ("integers", "even integers", "11480", "condition"),
    ],
    "compound-interest-20y": [
        ("compounded yearly", "simple", "2000", "condition"),
        ("balance", "interest earned", "1653.28", "asked"),
        ("deposit", "borrow", "2653.28 owed", "concept"),
    ],
    "collatz-27": [
        ("how many steps", "what is the largest number", "9232", "asked"),
        ("reach 1", "first go below 27", "96", "condition"),
        ("how many steps", "how many odd steps", "41", "asked"),
    ],
}

LEAD_INS = ("Quick question: ", "I need help with this one. ", "Please answer: ")
COMMUTATIVE = re.compile(r"What is (\S+) times (\S+)\?|of (\d+) and (\d+)|legs of (\d+) and (\d+)")


def imperative(problem: str) -> str | None:
    """ "What is X?" -> "Compute X." (None when the problem does not start that way)."""
    m = re.match(r"What is (.+)\?$", problem)
    return f"Compute {m.group(1)}." if m else None


def swap_operands(problem: str) -> str | None:
    m = COMMUTATIVE.search(problem)
    if not m:
        return None
    a, b = (g for g in m.groups() if g is not None)
    start, end = m.span()
    return problem[:start] + m.group(0).replace(a, "\0").replace(b, a).replace("\0", b) + problem[end:]


def main() -> None:
    entries = [json.loads(line) for line in LIBRARY.read_text().splitlines() if line.strip()]
    rows = []
    for n, e in enumerate(entries):
        eid, problem, answer = e["id"], e["problem"], e["answer"]
        rows.append(
            {"id": f"tu-repeat-{eid}", "question": problem, "answer": answer, "expect_entry": eid, "kind": "repeat"}
        )
        paras = [(LEAD_INS[n % len(LEAD_INS)] + problem, "filler")]
        for rewrite, kind in ((imperative, "verbs"), (swap_operands, "commutative")):
            if (text := rewrite(problem)) is not None:
                paras.append((text, kind))
        if len(paras) < 2:
            paras.append((problem.rstrip("?.") + ", please?", "filler"))
        for i, (text, kind) in enumerate(paras, 1):
            rows.append(
                {
                    "id": f"tu-para-{eid}-{i}",
                    "question": text,
                    "answer": answer,
                    "expect_entry": eid,
                    "kind": f"paraphrase/{kind}",
                }
            )
        for i, (old, new, right, kind) in enumerate(SWAPS[eid], 1):
            assert old in problem, (eid, old)
            assert right != answer, (eid, new)
            rows.append(
                {
                    "id": f"tu-near-{eid}-{i}",
                    "question": problem.replace(old, new, 1),
                    "answer": right,
                    "expect_entry": None,
                    "near_miss_of": eid,
                    "kind": f"near-miss/{kind}",
                }
            )
    uncovered = [
        "What is the capital of Italy?",
        "How many continents are there?",
        "What is 11 times 12?",
        "In Python, what is len('hello')?",
        "What is the freezing point of water in Fahrenheit?",
        "How many hours are in a day?",
        "What is the square root of 81?",
        "Who discovered penicillin?",
    ]
    answers = ["Rome", "7", "132", "5", "32", "24", "9", "Alexander Fleming"]
    for i, (q, a) in enumerate(zip(uncovered, answers), 1):
        rows.append({"id": f"tu-uncovered-{i}", "question": q, "answer": a, "expect_entry": None, "kind": "uncovered"})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
