"""Which questions the numerals check reads: those that change nothing but the writing of an entry's numbers."""

from __future__ import annotations

import pytest

from kvgraft_plugin.routing.numerals import MAX_WORDS, numerals_turns, written_numbers


@pytest.mark.parametrize(
    ("problem", "question", "written"),
    [
        ("A box holds 3 eggs.", "A box holds three eggs.", (("holds three eggs", "holds 3 eggs"),)),
        ("Add 17 and 23.", "Add seventeen and twenty-three.",
         (("add seventeen and", "add 17 and"), ("and twenty three", "and 23"))),  # at the end: no token after
        ("राम ने 3 किलो आलू खरीदे।", "राम ने तीन किलो आलू खरीदे।", (("ने तीन किलो", "ने 3 किलो"),)),
        ("一袋米重5千克。", "一袋米重五千克。", (("重五千", "重5千"),)),  # an unspaced script's words are joined
        ("A box holds three eggs.", "A box holds 3 eggs.", ()),  # the entry's numbers are in digits
        ("A box holds 3 eggs.", "A box holds 4 eggs.", ()),  # digits for digits: the numbers guard's
        ("A box holds 3 eggs.", "A crate holds three eggs.", ()),  # more than the writing changed
        ("A box holds 3 eggs.", "A box holds three eggs?", (("holds three eggs", "holds 3 eggs"),)),
        ("A box holds 3 eggs.", "A box holds 3 eggs.", ()),  # nothing changed
        ("A box holds 3 eggs.", "A box holds " + "very " * (MAX_WORDS + 1) + "eggs.", ()),  # too many words
    ],
)  # fmt: skip
def test_written_numbers_are_the_only_change(problem, question, written):
    assert written_numbers(problem, question) == written


def test_the_reading_prompt_ends_with_the_phrase_in_words_and_in_digits_as_the_reply():
    turns = numerals_turns("cuesta sesenta euros", "cuesta 60 euros")
    assert turns[0][0] == "system" and turns[-2:] == [
        ("user", "cuesta sesenta euros"),
        ("assistant", "cuesta 60 euros"),
    ]
    assert all(role == ("user", "assistant")[i % 2] for i, (role, _) in enumerate(turns[1:]))
