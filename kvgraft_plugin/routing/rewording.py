"""The rewording check: a small edit of an entry read as the model's own rewrite of the entry's problem.

A question that keeps most of an entry's words (a small edit, `kvgraft_plugin.routing.judge.clear_yes`) needs a
clear Yes from the judge, because a yes/no margin reads small edits poorly: on the held-out edits sets it
scored "18 kilograms" for "18 kg" and "lowered" for "reduced" below 0, as it did "radius" for "diameter". A
language model reads them better as text it might write. The check asks the judge model to rewrite the
entry's problem twice, in two prompts that differ only in their instruction and worked examples: one keeps the
answer (`KEEP`), the other changes it (`CHANGE`), and scores the question as the model's reply to each. Its
score is the log-likelihood ratio, keep over change, of the tokens the edit wrote (each changed token and the
one after a change, `edited`): a rewording is likelier kept, a near-miss likelier changed. The unchanged
tokens are left out, as both prompts copy them alike.

A small edit the judge leaves between its threshold and a clear Yes passes when this score is at least
`REWORDING_THRESHOLD`, and one it gives a clear Yes is refused when the score is below `REWORDING_VETO`
(`kvgraft_plugin.routing.judge.Judge`); nothing else is decided by it.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CHANGE",
    "KEEP",
    "REWORDING_PROMPT",
    "REWORDING_THRESHOLD",
    "REWORDING_VETO",
    "Rewrite",
    "edited",
    "log_likelihood",
]

#: Name of the prompts below; a cached or recorded score holds for these prompts only.
REWORDING_PROMPT = "rewording-v1"
#: The log-likelihood ratio a small edit needs, chosen on the tuning sets alone (examples/edits-dev and
#: examples/judge-dev; docs/routing-history.md): their near-misses in the judge's grey zone scored at most +0.29 and
#: their paraphrases there at least +1.63.
REWORDING_THRESHOLD = 1.0
#: Below this score a small edit is read as a changed problem, and refused even with a clear Yes: the sign of
#: the ratio, no fitted number. On the tuning sets it refused 4 of the 5 near-misses the judge gave a clear Yes
#: and 4 of its 53 paraphrases there (docs/routing-history.md).
REWORDING_VETO = 0.0

#: (problem, a rewording that keeps its answer, a small edit that changes it): written for the check, in no
#: test set. Both prompts rewrite the same problems.
_SHOTS: tuple[tuple[str, str, str], ...] = (
    ("A bottle holds 2 litres of water. How many 250 ml glasses can it fill?",
     "A bottle contains 2 litres of water. How many 250 ml glasses can it fill?",
     "A bottle holds 2 gallons of water. How many 250 ml glasses can it fill?"),
    ("A cyclist rides 36 km in 2 hours. What is her average speed in km/h?",
     "A cyclist rides 36 kilometres in 2 hours. What is her average speed in km/h?",
     "A cyclist rides 36 km in 2 hours. What is her average speed in m/s?"),
    ("Ein Quadrat hat eine Seitenlänge von 5 cm. Wie groß ist sein Umfang?",
     "Ein Quadrat hat eine Seitenlänge von 5 cm. Wie groß ist der Umfang des Quadrats?",
     "Ein Quadrat hat eine Seitenlänge von 5 cm. Wie groß ist sein Flächeninhalt?"),
    ("How many of the months of the year have 31 days?",
     "How many months of the year have 31 days?",
     "How many of the months of the year do not have 31 days?"),
    ("一袋米重5千克，3袋米重多少千克？",
     "一袋大米重5千克，3袋大米一共重多少千克？",
     "一袋米重5千克，3袋米重多少克？"),
    ("The price of a lamp is lowered from 50 dollars to 40 dollars. By what percentage did the price fall?",
     "The price of a lamp is cut from 50 dollars to 40 dollars. By what percentage did the price drop?",
     "The price of a lamp is lowered from 50 dollars to 40 dollars. By how many dollars did the price fall?"),
    ("A circle has a diameter of 10 cm. What is its circumference?",
     "A circle has a diameter of 10 cm. Please find its circumference.",
     "A circle has a radius of 10 cm. What is its circumference?"),
    ("Un coche consume 6 litros cada 100 km. ¿Cuántos litros gasta en 250 km?",
     "Un coche gasta 6 litros cada 100 km. ¿Cuántos litros consume en 250 km?",
     "Un coche consume 6 litros cada 100 millas. ¿Cuántos litros gasta en 250 km?"),
    ("1個80円のみかんを6個買いました。代金はいくらですか。",
     "1個80円のみかんを6個買いました。代金はいくらでしょうか。",
     "1個80円のみかんを6個買いました。1個あたりの代金はいくらですか。"),
    ("A rectangle is 6 cm long and 4 cm wide. What is its area?",
     "A rectangle is 4 cm wide and 6 cm long. What is its area?",
     "A rectangle is 6 cm long and 4 cm wide. What is its perimeter?"),
)  # fmt: skip


@dataclass(frozen=True)
class Rewrite:
    """One of the two rewrite prompts: an instruction and its worked rewrites, then the entry's problem, the
    question as the model's reply."""

    name: str
    system: str
    keeps: bool
    """The worked rewrites keep the answer (else they change it)."""

    def turns(self, problem: str, question: str) -> list[tuple[str, str]]:
        """The chat: the instruction, the worked rewrites, the problem and, as the reply, the question."""
        turns = [("system", self.system)]
        for shot, kept, changed in _SHOTS:
            turns += [("user", f"Problem: {shot}"), ("assistant", kept if self.keeps else changed)]
        return [*turns, ("user", f"Problem: {problem}"), ("assistant", question)]


KEEP = Rewrite(
    "keep",
    "You reword problems. The reworded problem keeps every given value and asks the same question, so that its "
    "answer is the same. Reply with the reworded problem only.",
    keeps=True,
)
CHANGE = Rewrite(
    "change",
    "You edit problems slightly. The edited problem changes a given value, a unit, a condition or the question "
    "asked, so that its answer is different. Reply with the edited problem only.",
    keeps=False,
)


def edited(entry: Sequence[int], question: Sequence[int]) -> list[bool]:
    """For each of the question's tokens: whether the edit wrote it (it is not aligned with the entry's tokens)
    or it follows what the edit changed (an insertion, a deletion or a replacement just before it)."""
    mask = [False] * len(question)
    matcher = difflib.SequenceMatcher(None, list(entry), list(question), autojunk=False)
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            for j in range(j1, min(j2 + 1, len(question))):
                mask[j] = True
    return mask


def log_likelihood(logits: np.ndarray, token: int) -> float:
    """The log-probability of ``token`` under ``logits`` (float64, so the sum is the same on every run)."""
    values = logits.astype(np.float64)
    top = values.max()
    return float(values[token] - top - np.log(np.exp(values - top).sum()))
