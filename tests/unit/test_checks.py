import pytest

from kvgraft_plugin import Entry
from kvgraft_plugin.curation.answer_checks import (
    answers_match,
    default_check,
    entry_problems,
    extract_answer,
    load_checker,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [(" 391\n\nProblem: x", "391"), ("The result.\nAnswer: 42", "42"), ("", ""), ("  tfargvk", "tfargvk")],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("got", "expected", "ok"),
    [
        ("391", "391", True),
        ("391.0", "391", True),
        ("1,048,576", "1048576", True),
        ("$60.", "60", True),
        ("Paris", "paris", True),
        ("392", "391", False),
        ("-4", "4", False),
    ],
)
def test_answers_match(got, expected, ok):
    assert answers_match(got, expected) is ok


def test_default_check_uses_the_answer_field():
    assert default_check({"answer": "45"}, " 45\n")
    assert not default_check({"answer": "45"}, " 54")


def test_entry_verification():
    good = Entry("a", "What is 2+2?", "2 + 2 = 4.", "4")
    bad = Entry("b", "What is 2+2?", "2 + 2 = 5.", "4")
    partial = Entry("c", "x", "the total is 40.", "4")
    assert entry_problems(good) == []
    assert entry_problems(bad) and entry_problems(partial)
    assert entry_problems(Entry("d", "x", "no answer field")) == []


def test_load_checker():
    assert load_checker(None) is default_check
    assert load_checker("kvgraft_plugin.curation.answer_checks:default_check") is default_check
    with pytest.raises(ValueError):
        load_checker("nonsense")


def test_a_positive_answer_is_not_found_in_a_negative_one():
    assert entry_problems(Entry("n", "What is -7 // 2?", "-7 // 2 = -4", "4"))
    assert entry_problems(Entry("n", "What is -7 // 2?", "-7 // 2 = -4", "-4")) == []


def test_code_is_checked_by_running_its_tests():
    from kvgraft_plugin.curation.answer_checks import code_program, run_tests, tests_checker
    from kvgraft_plugin.library.template import Entry

    prompt = 'def double(x):\n    """Twice x."""'
    tests = "assert double(2) == 4"
    assert run_tests(code_program(prompt, "    return 2 * x", tests, tested_name=None)) is None
    assert "AssertionError" in run_tests(code_program(prompt, "    return x", tests, tested_name=None))
    assert "past" in run_tests("while True: pass", timeout=0.5)
    # a reworded query renames the function: the entry's tests still run, under the asked name
    renamed = 'def twice(v):\n    """Return v doubled."""'
    check = tests_checker(lambda query: (prompt, tests))
    assert check({"question": renamed}, "    return v * 2")
    assert check({"question": renamed}, "def twice(v):\n    return v + v")  # a complete function counts too
    assert not check({"question": renamed}, "    return v")
    assert not tests_checker(lambda query: None)({"question": renamed}, "    return v * 2")
    entry = Entry("d", prompt, "    return x + 1", tests=tests)
    assert entry_problems(entry) and "tests fail" in entry_problems(entry)[0]


FENCED_ANSWER = """Certainly! Below is the implementation:

```python
def helper(x):
    return x

def run_length_encode(text):
    return "a3b1"
```

Example usage:

```python
print(run_length_encode("aaab"))
```
"""


@pytest.mark.parametrize(
    ("text", "name", "expected_start"),
    [
        (FENCED_ANSWER, "run_length_encode", "def helper(x):"),  # the block that defines the asked name
        ("```py\nx = 1\n```", "f", "x = 1"),  # no block defines it: the last block
        ("```python\ndef f():\n    return 1", "f", "def f():"),  # a cut answer: the fence never closed
        ("Here:\ndef f(a):\n    return a\nThat is all.", "f", "def f(a):"),  # no fence: the asked def
        ("    return a + 1", "f", "    return a + 1"),  # a body continuing the prompt
    ],
)
def test_extract_code(text, name, expected_start):
    from kvgraft_plugin.curation.answer_checks import extract_code

    code = extract_code(text, name)
    assert code.startswith(expected_start) and "```" not in code and "That is all" not in code


def test_tests_checker_reads_an_instruct_models_fenced_answer():
    from kvgraft_plugin.curation.answer_checks import tests_checker

    problem = 'def run_length_encode(text):\n    """Encode runs."""'
    check = tests_checker(lambda q: (problem, "assert run_length_encode('aaab') == 'a3b1'"))
    assert check({"question": problem}, FENCED_ANSWER)
    assert not check({"question": problem}, FENCED_ANSWER.replace('"a3b1"', '"a3"'))


def test_a_body_that_starts_with_an_import_continues_its_prompt():
    from kvgraft_plugin.curation.answer_checks import code_program, run_tests

    prompt = 'def today_iso():\n    """The date 2024-01-01 as ISO text."""'
    body = "    import datetime\n    return datetime.date(2024, 1, 1).isoformat()"
    program = code_program(prompt, body, "assert today_iso() == '2024-01-01'", tested_name=None)
    assert program.startswith(prompt) and run_tests(program) is None
