"""The numerals check: a question that writes an entry's numbers in words, read back into digits by the model.

"A farmer harvests forty-two tonnes" for "... 42 tonnes", "राम ने तीन किलो" for "राम ने 3 किलो", "dört yüz lira"
for "400 lira": nothing but the numbers changed, and only their writing. The judge scores such questions
below a clear Yes often (6 of the 9 "spelled-out" paraphrases it missed on `examples/edits-c/`), and the
rewording check reads them no better in the languages the judge model knows least. Writing a number in digits
is a task a small model does well in many languages, and one that can be checked exactly: asked to rewrite
the question's phrase around the number ("ने तीन किलो": the words and the token on each side) with its numbers
in digits, the model must reply with the entry's phrase ("ने 3 किलो"), each of its tokens and then the end of
the turn its most likely next token (`kvgraft_plugin.routing.judge.Judge.numerals` teacher-forces the reply and
compares each argmax; nothing is decoded). The neighbours keep the words in their role: "the third fastest"
reads as "the 3rd fastest", not "the 3 fastest", and "three large eggs" as "3 large eggs", not "3 eggs".

Which pairs are read is decided by their shape alone (`written_numbers`): every difference from the entry is
one of its numbers written as at most `MAX_WORDS` words without digits. A pair whose phrases all read back
passes (`kvgraft_plugin.routing.judge.JudgeVerdict.passed`); any other pair is judged as before.
"""

from __future__ import annotations

import difflib

from kvgraft_plugin.routing.text_shape import tokens, unspaced

__all__ = ["MAX_WORDS", "NUMERALS_PROMPT", "NUMERALS_SYSTEM", "Reading", "numerals_turns", "written_numbers"]

#: Name of the prompt below; a cached or recorded reading holds for this prompt only.
NUMERALS_PROMPT = "numerals-v1"
#: The most words a number is written in ("two hundred and fifty", "iki yüz elli").
MAX_WORDS = 5

NUMERALS_SYSTEM = (
    "You rewrite phrases with every number written in digits. Change nothing else. Reply with the rewritten "
    "phrase only."
)
#: (a phrase with a number in words, the phrase with it in digits): written for the check, in no test set,
#: lower-cased like the phrases read (`kvgraft_plugin.routing.text_shape.tokens`). An ordinal keeps its ending.
_SHOTS: tuple[tuple[str, str], ...] = (
    ("holds forty-two litres", "holds 42 litres"),
    ("fährt dreihundertfünf kilometer", "fährt 305 kilometer"),
    ("买两本", "买2本"),
    ("compte cinquante mille habitants", "compte 50000 habitants"),
    ("купил двадцать пять яблок", "купил 25 яблок"),
    ("mix two and a half cups", "mix 2.5 cups"),
    ("won the third race", "won the 3rd race"),
    ("for three hours", "for 3 hours"),
)

Reading = tuple[str, str]
"""A phrase of the question with a number in words, and the entry's phrase with it in digits: what the model
must rewrite the first into."""


def written_numbers(problem: str, question: str) -> tuple[Reading, ...]:
    """Each number ``question`` writes in words where ``problem`` writes it in digits, as a `Reading` with the
    token before and after it that both share, when that is all it changes (`kvgraft_plugin.routing.text_shape.tokens`:
    case and punctuation are not read); else ``()``."""
    a, b = tokens(problem), tokens(question)
    out: list[Reading] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        number, words = a[i1:i2], b[j1:j2]
        if tag != "replace" or len(number) != 1 or not number[0][0].isdigit() or len(words) > MAX_WORDS:
            return ()
        if any(word[0].isdigit() for word in words):
            return ()
        before, after = a[max(i1 - 1, 0) : i1], a[i2 : i2 + 1]
        out.append((_phrase(before + words + after), _phrase(before + number + after)))
    return tuple(out)


def _phrase(words: tuple[str, ...]) -> str:
    """The tokens as text: no space next to a character of a script written without spaces."""
    out = words[0]
    for left, right in zip(words, words[1:], strict=False):
        out += ("" if unspaced(left) or unspaced(right) else " ") + right
    return out


def numerals_turns(words: str, digits: str) -> list[tuple[str, str]]:
    """The chat: the instruction, the worked rewrites, the phrase in words and, as the reply, in digits."""
    turns = [("system", NUMERALS_SYSTEM)]
    for shot_words, shot_digits in _SHOTS:
        turns += [("user", shot_words), ("assistant", shot_digits)]
    return [*turns, ("user", words), ("assistant", digits)]
