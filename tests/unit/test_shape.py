"""The shape of a text: tokens in any script, exchanges of like spans, operators between numbers."""

from __future__ import annotations

import pytest

from kvgraft_plugin.routing.text_shape import carried, operations, swap, tokens


def test_tokens_split_unspaced_scripts_into_characters_and_drop_punctuation():
    assert tokens("甲比乙大5岁，乙今年10岁") == ("甲", "比", "乙", "大", "5", "岁", "乙", "今", "年", "10", "岁")
    assert tokens("Wie viel Prozent sind 18 von 72?") == ("wie", "viel", "prozent", "sind", "18", "von", "72")
    assert tokens("8:15 and 1,80 m") == ("8:15", "and", "1,80", "m")


def test_a_word_keeps_the_marks_written_on_its_letters():
    # Vowel signs, viramas and nuktas are combining marks, which ``\w`` leaves out: a word is still one token.
    assert tokens("राम ने 3 किलो आलू खरीदे।") == ("राम", "ने", "3", "किलो", "आलू", "खरीदे")
    assert tokens("চালিশ হাজার টাকা") == ("চালিশ", "হাজার", "টাকা")
    assert tokens("cafe\u0301 40") == ("cafe\u0301", "40")  # an accent written apart
    # A run of an unspaced script is split into characters even where it holds a symbol that is not a letter.
    assert tokens("何cm²ですか") == ("何", "c", "m", "²", "で", "す", "か")


@pytest.mark.parametrize(
    ("first", "second", "exchanged"),
    [
        ("Is Lyon to the south of Paris?", "Is Paris to the south of Lyon?", ("lyon", "paris")),
        ("A call at 9:00 in Rome (UTC+1), in Quito (UTC−5)?", "A call at 9:00 in Quito (UTC−5), in Rome (UTC+1)?",
         ("rome utc 1", "quito utc 5")),
        ("New York to New Jersey", "New Jersey to New York", ("york", "jersey")),
        ("What is 3/4 of 12?", "What is 4/3 of 12?", ("3", "4")),  # adjacent single tokens
        ("What is 5 - 8?", "What is 8 - 5?", ("5", "8")),  # "-" does not commute
        ("Ana, Bo and Cy are 1,62 m, 1,75 m and 1,58 m tall.", "Ana, Bo and Cy are 1,75 m, 1,62 m and 1,58 m tall.",
         ("1,62", "1,75")),  # a list of quantities: the word between follows both numbers
    ],
)  # fmt: skip
def test_swap_names_the_exchanged_spans(first, second, exchanged):
    assert swap(first, second) == exchanged


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Is Lyon to the south of Paris?", "Is Lyon to the south of Paris?"),  # nothing changed
        ("What is the tallest tree in Chile by height?", "By height, what is the tallest tree in Chile?"),  # moved
        ("Wie viel Prozent sind 18 von 72?", "Von 72 sind 18 wie viel Prozent?"),  # a number and words: unlike
        ("Is Lyon to the south of Paris?", "Is Lyon to the north of Paris?"),  # a replacement, not an exchange
        ("What is 17 plus 23?", "What is 23 plus 17?"),  # two numbers around one word: for the numbers guard
        ("What is 5 + 8?", "What is 8 + 5?"),  # around a written "+"
        ("one two three four five and six", "six and one two three four five"),  # a span of 5: a moved clause
    ],
)
def test_swap_is_none_without_an_exchange_of_like_spans(first, second):
    assert swap(first, second) is None


@pytest.mark.parametrize(
    ("first", "second", "moved"),
    [
        ("It uses 8 kWh by day and 5 kWh at night.", "It uses 5 kWh at night and 8 kWh by day.", True),
        ("A team scored 47 goals and conceded 32.", "A team conceded 32 goals and scored 47.", True),
        ("Rina 152 cm, Sari 1,48 m.", "Rina 1,48 m, Sari 152 cm.", True),  # moved without names: the judge reads it
        ("Rina 152 cm, Sari 148 cm.", "Rina 148 cm, Sari 152 cm.", False),  # values alone
        ("A call at 9:00 in Rome (UTC+1), in Quito (UTC−5)?", "A call at 9:00 in Quito (UTC−5), in Rome (UTC+1)?",
         True),  # the order matters here, and only the judge reads that
        ("Noon in Oslo (UTC+1) is what time in Lima (UTC−5)?", "Noon in Lima (UTC−5) is what time in Oslo (UTC+1)?",
         False),  # two clauses apart
        ("Is Lyon to the south of Paris?", "Is Paris to the south of Lyon?", False),  # no numbers
        ("по 18 гривень та ручку за 12,50 гривні", "по 12,50 гривні та ручку за 18 гривень", False),  # one unit
        ("It uses 8 kWh by day.", "It uses 8 kWh by day.", False),  # nothing moved
    ],
)  # fmt: skip
def test_carried_reads_listed_items_that_moved_with_their_own_words(first, second, moved):
    assert carried(first, second) is moved


def test_operations_read_operators_between_numbers_only():
    assert operations("Solve for x: 5x - 7 = 3x + 9.") == (("5", "-", "7"), ("7", "=", "3"), ("3", "+", "9"))
    assert operations("17 x 23 and 17×23 and 17 * 23") == (("17", "*", "23"),) * 3
    assert operations("What is 1,000 − 37?") == (("1,000", "-", "37"),)
    assert operations("Take g = 10 m/s^2 at UTC−5, 21:45, a 2 : 5 ratio, H2O") == ()
