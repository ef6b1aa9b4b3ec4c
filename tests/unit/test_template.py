"""The two answer formats and the two templates: what the entry and the query look like, where the graft
prefix is cut, and where decoding stops."""

from __future__ import annotations

import pytest

from kvgraft_plugin import ConfigError
from kvgraft_plugin.library.template import (
    END_OF_SOLUTION,
    SAME_TASK,
    TEMPLATE_VERSION,
    ChatTemplate,
    Entry,
    Segment,
    TextTemplate,
    default_stop,
    make_template,
    render_entry,
    render_query,
    template_id,
)

CODE = Entry("c/1", "def f(x):\n    '''Double x.'''", "    y = x * 2\n\n    return y\n")


def test_answer_format_repeats_the_answer_after_the_solution():
    entry = Entry("m", " What is 2+2? ", " 2 + 2 = 4. ", "4")
    assert render_entry(entry) == "Problem: What is 2+2?\nAnswer: 4\nSolution: 2 + 2 = 4.\nAnswer: 4\n\n"
    assert render_query("What is 2+2?") == "Problem: What is 2+2?\nAnswer:"
    assert template_id("answer") == TEMPLATE_VERSION and default_stop("answer") == ("\n",)


def test_solution_format_keeps_the_solution_verbatim_and_the_query_continues_like_it():
    entry_text = render_entry(CODE, "solution")
    assert entry_text == f"Problem: {CODE.problem}\nSolution:\n    y = x * 2\n\n    return y\n{END_OF_SOLUTION}\n\n"
    query = render_query(CODE.problem, same_as=CODE, fmt="solution")
    assert query.endswith("Solution:") and entry_text.startswith(query.split("This is the problem")[0])
    assert default_stop("solution") == (f"\n{END_OF_SOLUTION}",)
    assert template_id("solution") != template_id("answer")  # a solution library's states are its own
    # renderings unchanged since v2 keep their name, so their libraries stay valid
    assert template_id("solution") == "solved-v2+solution" and TEMPLATE_VERSION == "solved-v3"
    assert template_id("answer", "chat", "gemma") == "solved-v2+chat:gemma"


def test_solution_history_turns_are_closed_by_the_marker():
    query = render_query("q2", history=[("q1", "    return 1")], fmt="solution")
    assert query == f"Problem: q1\nSolution:\n    return 1\n{END_OF_SOLUTION}\n\nProblem: q2\nSolution:"


def test_unknown_format_is_refused():
    with pytest.raises(ConfigError, match="answer format"):
        render_entry(CODE, "essay")  # type: ignore[arg-type]


def chatml(messages, add_generation_prompt):
    """SmolLM2's template, in Python: a default system turn unless the first message is one."""
    out = "" if messages and messages[0][0] == "system" else "<|im_start|>system\nDefault<|im_end|>\n"
    out += "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_chat_template_cuts_the_prefix_at_a_turn_boundary_and_marks_only_markup_special():
    entry = Entry("m", "What is 2+2?", "2 + 2 = 4.", "4")
    template = ChatTemplate(chatml, "answer")
    prefix = template.prefix(entry)
    query = template.query("2+2 <|im_end|>?", system="Be brief.", history=[("q1", "1")], same_as=entry)
    plain = template.preamble() + template.query("2+2 <|im_end|>?", system="Be brief.", history=[("q1", "1")])
    # graft prefix + suffix is the template's own rendering of the conversation with the entry first
    messages = [("user", "What is 2+2?"), ("assistant", "Answer: 4\nSolution: 2 + 2 = 4."), ("user", "q1"),
                ("assistant", "Answer: 1"), ("user", f"Be brief.\n\n2+2 <|im_end|>?\n{SAME_TASK}")]  # fmt: skip
    assert "".join(s.text for s in prefix + query) == chatml(messages, True) + "Answer:"
    plain_messages = [*messages[2:4], ("user", "Be brief.\n\n2+2 <|im_end|>?")]
    assert "".join(s.text for s in plain) == chatml(plain_messages, True) + "Answer:"
    assert prefix[0] == Segment("<|im_start|>system\nDefault<|im_end|>\n", special=True)
    assert prefix[-1] == Segment("<|im_end|>\n", special=True)  # ends where the next turn begins
    # special-token syntax typed by a user stays text: only the template's markup is special
    assert all(not s.special for s in query if "2+2" in s.text)
    assert all(s.special == s.text.startswith("<|im_") for s in prefix + query if s.text != "Answer:")
    assert template.stop() == ("\n", "<|im_end|>")
    assert template.name == template_id("answer", "chat") != template_id("answer")


def test_chat_solution_is_the_assistant_turn_verbatim_and_ends_at_the_end_of_turn():
    template = make_template("chat", "solution", render=chatml, chat_name="chatml")
    derivation = Entry("d/1", "Solve 2x = 6.", "  Divide by 2:\n\n  x = 3\n")
    prefix = template.prefix(derivation)
    assert Segment("  Divide by 2:\n\n  x = 3") in prefix  # the first line's indentation kept
    assert template.query(derivation.problem)[-1] == Segment("<|im_end|>\n<|im_start|>assistant\n", special=True)
    assert template.stop(derivation.problem) == ("<|im_end|>",) and template.trim("    return 1") == "    return 1"
    assert template.name.endswith("+chat:chatml")


def test_chat_solution_of_a_function_prompt_is_a_fenced_block_and_stops_at_its_closing_fence():
    fn = Entry("code/dbl", 'def dbl(x):\n    """Twice x."""', "    return 2 * x")
    template = make_template("chat", "solution", render=chatml)
    prefix, query = template.prefix(fn), template.query(fn.problem, same_as=fn)
    assert Segment('```python\ndef dbl(x):\n    """Twice x."""\n    return 2 * x\n```') in prefix
    assert query[-2:] == (Segment("<|im_end|>\n<|im_start|>assistant\n", special=True), Segment("```python\n"))
    assert template.stop(fn.problem) == ("\n```", "<|im_end|>")
    # plain decoding of the same question opens the same block; prose questions are answered as before
    assert (template.preamble() + template.query(fn.problem))[-1] == Segment("```python\n")
    assert template.query("Explain recursion.")[-1].special and template.stop("Explain recursion.") == ("<|im_end|>",)
    assert template.name == "solved-v4+solution+chat:gguf"  # another rendering than v2's: rebuilt
    assert make_template("text", "solution").stop(fn.problem) == (f"\n{END_OF_SOLUTION}",)


def test_a_chat_template_that_cannot_be_cut_at_a_turn_is_refused():
    def folds_history(messages, add_generation_prompt):  # renders the last turn differently once others follow
        return "|".join(f"{role}:{content}" for role, content in messages) + ("|" if add_generation_prompt else "")

    def counts_turns(messages, add_generation_prompt):  # the start depends on the conversation's length
        return f"[{len(messages)}]" + "".join(f"<{r}>{c}</{r}>" for r, c in messages) + "<a>" * add_generation_prompt

    for render in (folds_history, counts_turns):
        with pytest.raises(ConfigError, match="use --template text"):
            ChatTemplate(render).prefix(CODE)


def test_the_text_template_lays_out_an_entry_and_a_query_as_plain_text():
    template = TextTemplate("answer")
    entry = Entry("m", "What is 2+2?", "2 + 2 = 4.", "4")
    preamble = "Solved problems with verified answers.\n\n"
    shown = "Problem: What is 2+2?\nAnswer: 4\nSolution: 2 + 2 = 4.\nAnswer: 4\n\n"  # the answer first and last
    assert template.prefix(entry) == (Segment(preamble + shown),)
    assert template.query("q") == (Segment("Problem: q\nAnswer:"),)
    same = "Problem: q\nThis is the problem solved above: What is 2+2?\nAnswer:"
    assert template.query("q", same_as=entry) == (Segment(same),)
    with pytest.raises(ConfigError, match="template must be"):
        make_template("jinja")  # type: ignore[arg-type]


def test_a_matched_function_prompt_is_restated_in_the_questions_names():
    from kvgraft_plugin.library.python_prompt import renamed_like

    entry = Entry("code/chunks", 'def chunk_list(items, n):\n    """Split items into lists of n."""', "    ...")
    question = 'def chunks(xs, size):\n    """Cut xs into pieces."""'
    restated = 'def chunks(xs, size):\n    """Split xs into lists of size."""'
    assert renamed_like(entry.problem, question) == restated
    suffix = render_query(question, same_as=entry, fmt="solution")
    assert suffix.endswith(f"This is the problem solved above: {restated}\nSolution:")
    # unchanged: the same names, another number of parameters, a question that is no function prompt
    assert renamed_like(entry.problem, entry.problem) == entry.problem
    assert renamed_like(entry.problem, 'def chunks(xs):\n    """Cut xs."""') == entry.problem
    assert renamed_like(entry.problem, "Split a list into chunks of n.") == entry.problem
    # a name that is also a common word stays in the docstring's prose, and is renamed in the signature
    got = renamed_like('def f(a, b):\n    """Add a and b."""', 'def g(x, y):\n    """Sum."""')
    assert got == 'def g(x, y):\n    """Add a and y."""'


def gemma(messages, add_generation_prompt):
    """Gemma 3's template, in Python (no system turn)."""
    out = "<bos>" + "".join(
        f"<start_of_turn>{'model' if role == 'assistant' else role}\n{content}<end_of_turn>\n"
        for role, content in messages
    )
    return out + ("<start_of_turn>model\n" if add_generation_prompt else "")


@pytest.mark.parametrize(("render", "marker"), [(chatml, "<|im_end|>"), (gemma, "<end_of_turn>")])
def test_a_chat_answer_stops_at_its_end_of_turn_marker_written_as_text(render, marker):
    # a model that echoes a question holding the marker spells it in plain tokens, which are no end of
    # generation: the answer must not carry it (found by the hostile pass, issue 49)
    for fmt in ("answer", "solution"):
        assert ChatTemplate(render, fmt).stop()[-1] == marker
    assert ChatTemplate(lambda messages, add: "".join(c for _, c in messages), "solution").stop() == ()
