"""The two answer formats: what the entry and the query look like, and where decoding stops."""

from __future__ import annotations

import pytest

from kvgraft_plugin import ConfigError
from kvgraft_plugin._template import (
    END_OF_SOLUTION,
    TEMPLATE_VERSION,
    Entry,
    default_stop,
    render_entry,
    render_query,
    template_id,
)

CODE = Entry("c/1", "def f(x):\n    '''Double x.'''", "    y = x * 2\n\n    return y\n")


def test_answer_format_is_unchanged():
    entry = Entry("m", " What is 2+2? ", " 2 + 2 = 4. ", "4")
    assert render_entry(entry) == "Problem: What is 2+2?\nAnswer: 4\nSolution: 2 + 2 = 4.\n\n"
    assert render_query("What is 2+2?") == "Problem: What is 2+2?\nAnswer:"
    assert template_id("answer") == TEMPLATE_VERSION and default_stop("answer") == ("\n",)


def test_solution_format_keeps_the_solution_verbatim_and_the_query_continues_like_it():
    entry_text = render_entry(CODE, "solution")
    assert entry_text == f"Problem: {CODE.problem}\nSolution:\n    y = x * 2\n\n    return y\n{END_OF_SOLUTION}\n\n"
    query = render_query(CODE.problem, same_as=CODE, fmt="solution")
    assert query.endswith("Solution:") and entry_text.startswith(query.split("This is the problem")[0])
    assert default_stop("solution") == (f"\n{END_OF_SOLUTION}",)
    assert template_id("solution") != template_id("answer")  # a solution library's states are its own


def test_solution_history_turns_are_closed_by_the_marker():
    query = render_query("q2", history=[("q1", "    return 1")], fmt="solution")
    assert query == f"Problem: q1\nSolution:\n    return 1\n{END_OF_SOLUTION}\n\nProblem: q2\nSolution:"


def test_unknown_format_is_refused():
    with pytest.raises(ConfigError, match="answer format"):
        render_entry(CODE, "essay")  # type: ignore[arg-type]
