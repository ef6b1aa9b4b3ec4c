"""Write the code example library (``library.jsonl``) and its queries (``queries.jsonl``).

Every task was written for this project (none is copied from a public benchmark). Each has a prompt (a
signature and a docstring), a solution (the function body, indented as it would be) and tests (asserts that
run after the prompt and the solution). Queries: every task asked again verbatim (``repeat``), some asked
in other words, without the examples or under another function name (``reworded``), and tasks the library
does not cover (``uncovered``, each with its own tests). Run: ``python examples/code/make_code.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def task(name: str, signature: str, doc: str, body: str, tests: str) -> dict[str, str]:
    return {
        "id": f"code/{name}",
        "problem": f'def {signature}:\n    """{doc}"""',
        "solution": body.strip("\n"),
        "tests": tests.strip(),
    }


TASKS = [
    task(
        "rle",
        "run_length_encode(text)",
        "Encode runs as char+count: 'aaab' -> 'a3b1'; '' -> ''.",
        """
    out = []
    i = 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(f"{text[i]}{j - i}")
        i = j
    return "".join(out)
""",
        "assert run_length_encode('aaab') == 'a3b1'\nassert run_length_encode('') == ''\n"
        "assert run_length_encode('abba') == 'a1b2a1'",
    ),
    task(
        "caesar",
        "caesar_shift(text, k)",
        "Shift letters by k places, keeping case; other characters stay.",
        """
    out = []
    for c in text:
        if c.isalpha():
            base = ord('A') if c.isupper() else ord('a')
            out.append(chr((ord(c) - base + k) % 26 + base))
        else:
            out.append(c)
    return "".join(out)
""",
        "assert caesar_shift('Abz!', 1) == 'Bca!'\nassert caesar_shift('Hello', -1) == 'Gdkkn'",
    ),
    task(
        "chunks",
        "chunk_list(items, n)",
        "Split items into lists of n; the last one may be shorter.",
        """
    return [items[i:i + n] for i in range(0, len(items), n)]
""",
        "assert chunk_list([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]\nassert chunk_list([], 3) == []",
    ),
    task(
        "digit-product",
        "nonzero_digit_product(n)",
        "Product of the non-zero digits of n >= 0 (1 if none).",
        """
    product = 1
    for d in str(n):
        if d != '0':
            product *= int(d)
    return product
""",
        "assert nonzero_digit_product(2051) == 10\nassert nonzero_digit_product(0) == 1\n"
        "assert nonzero_digit_product(99) == 81",
    ),
    task(
        "interleave",
        "interleave(a, b)",
        "Alternate items of a and b, then append what is left of the longer.",
        """
    out = []
    for x, y in zip(a, b):
        out += [x, y]
    shorter = min(len(a), len(b))
    return out + list(a[shorter:]) + list(b[shorter:])
""",
        "assert interleave([1, 2, 3], 'ab') == [1, 'a', 2, 'b', 3]\nassert interleave([], [7]) == [7]",
    ),
    task(
        "vowel-words",
        "count_vowel_words(sentence)",
        "How many words start with a vowel (aeiou, any case).",
        """
    return sum(1 for word in sentence.split() if word[0].lower() in 'aeiou')
""",
        "assert count_vowel_words('An apple is not a Pear') == 4\nassert count_vowel_words('') == 0",
    ),
    task(
        "second-largest",
        "second_largest(nums)",
        "The second largest distinct value, or None.",
        """
    distinct = sorted(set(nums))
    return distinct[-2] if len(distinct) >= 2 else None
""",
        "assert second_largest([3, 9, 9, 4]) == 4\nassert second_largest([5, 5]) is None",
    ),
    task(
        "flatten-once",
        "flatten_once(lists)",
        "Concatenate a list of lists (one level only).",
        """
    return [item for inner in lists for item in inner]
""",
        "assert flatten_once([[1], [2, [3]], []]) == [1, 2, [3]]",
    ),
    task(
        "balanced",
        "is_balanced(text)",
        "True when (), [] and {} in text are balanced and properly nested.",
        """
    pairs = {')': '(', ']': '[', '}': '{'}
    stack = []
    for c in text:
        if c in '([{':
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack
""",
        "assert is_balanced('a(b[c]{d})')\nassert not is_balanced('(]')\nassert not is_balanced('((')",
    ),
    task(
        "rotate",
        "rotate_left(items, k)",
        "Rotate a list left by k places (k may exceed its length).",
        """
    if not items:
        return []
    k %= len(items)
    return items[k:] + items[:k]
""",
        "assert rotate_left([1, 2, 3, 4], 5) == [2, 3, 4, 1]\nassert rotate_left([], 2) == []",
    ),
    task(
        "odd-positions",
        "sum_odd_positions(nums)",
        "Sum of the items at odd indices (1, 3, 5, ...).",
        """
    return sum(nums[1::2])
""",
        "assert sum_odd_positions([10, 1, 10, 2, 10, 3]) == 6\nassert sum_odd_positions([4]) == 0",
    ),
    task(
        "merge-ranges",
        "merge_ranges(ranges)",
        "Merge overlapping or touching [start, end] pairs; sorted.",
        """
    merged = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
""",
        "assert merge_ranges([[5, 7], [1, 3], [2, 4], [7, 8]]) == [[1, 4], [5, 8]]\nassert merge_ranges([]) == []",
    ),
    task(
        "camel-to-snake",
        "camel_to_snake(name)",
        "'parseHttpRequest' -> 'parse_http_request'.",
        """
    out = []
    for c in name:
        if c.isupper():
            out.append('_' + c.lower())
        else:
            out.append(c)
    return ''.join(out).lstrip('_')
""",
        "assert camel_to_snake('parseHttpRequest') == 'parse_http_request'\nassert camel_to_snake('Id') == 'id'",
    ),
    task(
        "snake-to-camel",
        "snake_to_camel(name)",
        "'parse_http_request' -> 'parseHttpRequest'.",
        """
    first, *rest = name.split('_')
    return first + ''.join(word.capitalize() for word in rest)
""",
        "assert snake_to_camel('parse_http_request') == 'parseHttpRequest'\nassert snake_to_camel('x') == 'x'",
    ),
    task(
        "char-histogram",
        "char_histogram(text)",
        "Count each character except spaces; keys in sorted order.",
        """
    counts = {}
    for c in sorted(text.replace(' ', '')):
        counts[c] = counts.get(c, 0) + 1
    return counts
""",
        "assert list(char_histogram('b a b')) == ['a', 'b']\nassert char_histogram('b a b') == {'a': 1, 'b': 2}",
    ),
    task(
        "triangular",
        "nth_triangular(n)",
        "The n-th triangular number: 1, 3, 6, 10, ... (n >= 1).",
        """
    return n * (n + 1) // 2
""",
        "assert nth_triangular(1) == 1\nassert nth_triangular(4) == 10\nassert nth_triangular(100) == 5050",
    ),
    task(
        "pair-diffs",
        "pairwise_diffs(nums)",
        "Differences of neighbours: [1, 4, 9] -> [3, 5].",
        """
    return [b - a for a, b in zip(nums, nums[1:])]
""",
        "assert pairwise_diffs([1, 4, 9]) == [3, 5]\nassert pairwise_diffs([2]) == []",
    ),
    task(
        "collatz-terms",
        "collatz_terms(n)",
        "How many terms the Collatz sequence from n has, n and 1 included.",
        """
    terms = 1
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        terms += 1
    return terms
""",
        "assert collatz_terms(1) == 1\nassert collatz_terms(6) == 9\nassert collatz_terms(27) == 112",
    ),
    task(
        "mask-email",
        "mask_email(email)",
        "Keep the first character of the name, star the rest: 'jo@x.io' -> 'j*@x.io'.",
        """
    name, domain = email.split('@', 1)
    return name[0] + '*' * (len(name) - 1) + '@' + domain
""",
        "assert mask_email('jo@x.io') == 'j*@x.io'\nassert mask_email('a@b.c') == 'a@b.c'",
    ),
    task(
        "duration",
        "parse_duration(text)",
        "Minutes in a duration such as '1h30m', '45m' or '2h'.",
        """
    minutes = 0
    number = ''
    for c in text:
        if c.isdigit():
            number += c
        elif c == 'h':
            minutes += 60 * int(number)
            number = ''
        elif c == 'm':
            minutes += int(number)
            number = ''
    return minutes
""",
        "assert parse_duration('1h30m') == 90\nassert parse_duration('45m') == 45\nassert parse_duration('2h') == 120",
    ),
    task(
        "dedupe",
        "dedupe_keep_order(items)",
        "Drop repeated items, keeping the first occurrence of each.",
        """
    seen = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
""",
        "assert dedupe_keep_order([3, 1, 3, 2, 1]) == [3, 1, 2]",
    ),
    task(
        "transpose",
        "transpose(matrix)",
        "Rows become columns: [[1, 2], [3, 4]] -> [[1, 3], [2, 4]].",
        """
    return [list(column) for column in zip(*matrix)]
""",
        "assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]\nassert transpose([]) == []",
    ),
    task(
        "longest-run",
        "longest_increasing_run(nums)",
        "Length of the longest strictly increasing run of neighbours.",
        """
    best = run = 1 if nums else 0
    for a, b in zip(nums, nums[1:]):
        run = run + 1 if b > a else 1
        best = max(best, run)
    return best
""",
        "assert longest_increasing_run([1, 2, 2, 3, 4, 5, 1]) == 4\nassert longest_increasing_run([]) == 0",
    ),
    task(
        "roman",
        "roman_to_int(numeral)",
        "Value of a Roman numeral such as 'XIV' or 'MCMXC'.",
        """
    values = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}
    total = 0
    for c, nxt in zip(numeral, numeral[1:] + ' '):
        value = values[c]
        total += -value if nxt != ' ' and values[nxt] > value else value
    return total
""",
        "assert roman_to_int('XIV') == 14\nassert roman_to_int('MCMXC') == 1990\nassert roman_to_int('III') == 3",
    ),
    task(
        "bits",
        "count_set_bits(n)",
        "Number of 1 bits in the binary form of n >= 0.",
        """
    count = 0
    while n:
        count += n & 1
        n >>= 1
    return count
""",
        "assert count_set_bits(0) == 0\nassert count_set_bits(255) == 8\nassert count_set_bits(10) == 2",
    ),
    task(
        "every-nth",
        "every_nth(items, n, start=0)",
        "Items at start, start + n, start + 2n, ...",
        """
    return items[start::n]
""",
        "assert every_nth([0, 1, 2, 3, 4, 5], 2) == [0, 2, 4]\nassert every_nth([0, 1, 2, 3, 4, 5], 3, 1) == [1, 4]",
    ),
]

#: (task, reworded prompt): the description rephrased, examples dropped, the function renamed.
REWORDED = [
    (
        "rle",
        'def rle(s):\n    """Compress a string by writing each run of a repeated character as the character then the run length."""',
    ),
    (
        "chunks",
        'def chunk_list(items, n):\n    """Break the list into consecutive pieces of size n; the final piece may have fewer items."""',
    ),
    (
        "second-largest",
        'def runner_up(values):\n    """Return the second biggest distinct number in values, or None when there is no such number."""',
    ),
    (
        "balanced",
        'def brackets_ok(s):\n    """Check that every bracket ( [ { in s is closed by the matching one in the right order."""',
    ),
    (
        "rotate",
        'def rotate_left(items, k):\n    """Move the first k elements of the list to its end (k can be larger than the list)."""',
    ),
    (
        "merge-ranges",
        'def merge_intervals(intervals):\n    """Combine overlapping or touching [start, end] intervals and return them sorted."""',
    ),
    ("camel-to-snake", 'def to_snake_case(name):\n    """Turn a camelCase identifier into snake_case."""'),
    ("triangular", 'def triangle_number(n):\n    """Return the sum 1 + 2 + ... + n."""'),
    (
        "collatz-terms",
        'def collatz_terms(n):\n    """Count the numbers in the Collatz sequence that starts at n and ends at 1, both ends counted."""',
    ),
    (
        "dedupe",
        'def unique_in_order(items):\n    """Remove duplicates from the list but keep the order in which items first appear."""',
    ),
    ("roman", 'def roman_to_int(numeral):\n    """Convert a Roman numeral string to an integer."""'),
    ("bits", 'def popcount(n):\n    """Return how many bits are set to 1 in the non-negative integer n."""'),
]

#: Tasks the library does not cover, each with its own tests.
UNCOVERED = [
    (
        'def is_palindrome(text):\n    """True when text reads the same backwards, ignoring case and spaces."""',
        "assert is_palindrome('Never odd or even')\nassert not is_palindrome('abc')",
    ),
    ('def factorial(n):\n    """n! for n >= 0."""', "assert factorial(0) == 1\nassert factorial(5) == 120"),
    (
        'def word_lengths(sentence):\n    """List the length of each word in the sentence."""',
        "assert word_lengths('a bb ccc') == [1, 2, 3]",
    ),
    (
        'def clamp(x, low, high):\n    """Limit x to the range [low, high]."""',
        "assert clamp(5, 0, 3) == 3\nassert clamp(-1, 0, 3) == 0\nassert clamp(2, 0, 3) == 2",
    ),
    (
        'def median(nums):\n    """The median of a non-empty list of numbers."""',
        "assert median([3, 1, 2]) == 2\nassert median([4, 1, 3, 2]) == 2.5",
    ),
    ('def gcd(a, b):\n    """Greatest common divisor of two positive integers."""', "assert gcd(84, 126) == 42"),
    (
        'def reverse_words(sentence):\n    """Reverse the order of the words in a sentence."""',
        "assert reverse_words('one two three') == 'three two one'",
    ),
    (
        'def celsius_to_fahrenheit(c):\n    """Convert a temperature from Celsius to Fahrenheit."""',
        "assert celsius_to_fahrenheit(100) == 212\nassert celsius_to_fahrenheit(0) == 32",
    ),
]


#: Words a near-miss swaps for their opposite (the first one found in the docstring).
ANTONYMS = {
    "largest": "smallest", "longest": "shortest", "first": "last", "last": "first", "left": "right",
    "odd": "even", "even": "odd", "increasing": "decreasing", "start": "end", "Product": "Sum", "Sum": "Product",
    "keeping": "dropping", "Minutes": "Seconds", "vowel": "consonant", "columns": "diagonals", "Encode": "Decode",
    "Shift": "Reverse", "Split": "Join", "Alternate": "Concatenate", "Merge": "Split", "Count": "List",
    "Drop": "Keep", "Concatenate": "Interleave", "True": "False", "Value": "Length", "Number": "Positions",
    "Differences": "Sums", "Keep": "Drop", "Items": "Indices", "terms": "odd terms",
}  # fmt: skip
#: A clause a near-miss adds: a changed condition.
CONDITION = " Negative values are skipped."
_EXAMPLE = re.compile(r"->|==")


def split_doc(doc: str) -> tuple[list[str], list[str]]:
    """(prose clauses, example clauses) of a docstring: a clause with ``->`` or ``==`` shows an example."""
    prose, examples = [], []
    for clause in (c.strip() for c in re.split(r"(?<=[.;])\s+", doc) if c.strip()):
        lead, colon, rest = clause.partition(": ")
        if _EXAMPLE.search(clause) and colon and _EXAMPLE.search(rest) and not _EXAMPLE.search(lead):
            prose.append(lead + ".")
            examples.append(rest)
        else:
            (examples if _EXAMPLE.search(clause) else prose).append(clause)
    return prose, examples


def parts(t: dict[str, str]) -> tuple[str, list[str], str]:
    """(function name, parameter names, docstring) of a task's prompt."""
    head, _, doc = t["problem"].partition(":\n")
    name, _, params = head.removeprefix("def ").rstrip(")").partition("(")
    return name, [p.split("=")[0].strip() for p in params.split(",")], doc.strip().strip('"')


def renamed(t: dict[str, str]) -> str:
    """The task with its function and parameters renamed (in the docstring too) and its examples dropped
    when prose remains: the same task, as the issue's paraphrase kinds for code ask."""
    name, params, doc = parts(t)
    prose, examples = split_doc(doc)
    doc = " ".join(prose if prose else examples)
    new_names = {p: f"{p}_in" for p in params if p not in ("a", "b", "i")}
    for old, new in new_names.items():
        doc = re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", new, doc)
    signature = t["problem"].split(":\n")[0].removeprefix("def ")
    signature = f"solve_{name}(" + signature.partition("(")[2]
    for old, new in new_names.items():
        signature = re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", new, signature)
    return f'def {signature}:\n    """{doc}"""'


def near_misses(t: dict[str, str]) -> list[tuple[str, str]]:
    """(kind, prompt): the task with one thing changed that changes its answer, each kind where it applies."""
    head, _, rest = t["problem"].partition(":\n")
    prose, examples = split_doc(parts(t)[2])
    out = []
    if examples:  # another expected output: the first example's last letter or digit moved on by one
        example = examples[0]
        i = max(i for i, c in enumerate(example) if c.isalnum())
        bumped = chr(ord(example[i]) + 1) if example[i] not in "9zZ" else "0"
        out.append(
            ("near-miss/example", f"{head}:\n{rest.replace(example, example[:i] + bumped + example[i + 1 :], 1)}")
        )
    word = next((w for w in re.findall(r"[A-Za-z]+", rest) if w in ANTONYMS), None)
    if word:  # the opposite operation or condition
        swapped = re.sub(rf"\b{word}\b", ANTONYMS[word], rest, count=1)
        out.append(("near-miss/antonym", f"{head}:\n{swapped}"))
    number = re.search(r"(?<![\w.'])\d+(?![\w'])", " ".join(prose))
    if number:  # another constant in the description
        bumped_rest = re.sub(rf"(?<![\w.']){number.group()}(?![\w'])", str(int(number.group()) + 1), rest, count=1)
        out.append(("near-miss/number", f"{head}:\n{bumped_rest}"))
    if "=" in head:  # another default value
        out.append(
            ("near-miss/default", re.sub(r"=(\d+)", lambda m: f"={int(m.group(1)) + 1}", head, count=1) + f":\n{rest}")
        )
    out.append(("near-miss/condition", t["problem"][:-3].rstrip() + CONDITION + '"""'))  # a condition added
    return out


def main() -> None:
    by_name = {t["id"].removeprefix("code/"): t for t in TASKS}
    queries = [
        {"id": f"repeat-{name}", "kind": "repeat", "question": t["problem"], "expect_entry": t["id"]}
        for name, t in by_name.items()
    ]
    queries += [
        {"id": f"reworded-{name}", "kind": "reworded", "question": prompt, "expect_entry": by_name[name]["id"]}
        for name, prompt in REWORDED
    ]
    queries += [
        {"id": f"uncovered-{i}", "kind": "uncovered", "question": prompt, "expect_entry": None, "tests": tests}
        for i, (prompt, tests) in enumerate(UNCOVERED)
    ]
    # generated by rule, not by hand: every task renamed, and every near-miss the rules give; the tasks at
    # odd positions are held out (the routing rules were tuned on the even ones only)
    routing = []
    for i, (name, t) in enumerate(by_name.items()):
        split = "heldout" if i % 2 else "tune"
        routing.append({"id": f"renamed-{name}", "kind": "renamed", "split": split, "question": renamed(t),
                        "expect_entry": t["id"]})  # fmt: skip
        routing += [
            {"id": f"{kind}-{name}", "kind": kind, "split": split, "question": prompt, "expect_entry": None,
             "near_miss_of": t["id"]}
            for kind, prompt in near_misses(t)
        ]  # fmt: skip
    (HERE / "routing.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in routing))
    for name, rows in (("library.jsonl", TASKS), ("queries.jsonl", queries)):
        (HERE / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(TASKS)} tasks, {len(queries)} queries, {len(routing)} routing queries")


if __name__ == "__main__":
    main()
