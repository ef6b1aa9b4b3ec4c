"""The judge: an instruct model asked whether a question and an entry's problem are the same problem.

Word lists only know the domains they were written for, and embeddings score a near-miss ("how fast" for
"how long") as high as a paraphrase. An instruct model reads both texts whole, in any domain and language. It
is asked once per (entry, question) pair, in a small context of its own (never the graft's: the graft stays
bitwise text RAG), and scored by the logit margin of "Yes" over "No" after the assistant's turn opens. The
threshold on that margin is a library setting, calibrated from labelled questions (`kvgraft calibrate`).

Every prompt of a view begins with the same start (its instruction and worked verdicts, ~1,300 tokens). The
start is prefilled once, and its cells are saved as a state, kept between processes by `JudgeStarts`; a
prompt restores its start and prefills only the pair. On this build a prefill split anywhere, or continued
from a restored state, is bitwise the unsplit one, so a margin does not depend on what was judged before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgraft_plugin.core.backend import Backend
from kvgraft_plugin.core.config import LlamaConfig
from kvgraft_plugin.core.exceptions import ConfigError, ContextOverflowError
from kvgraft_plugin.core.models import check_unchanged, file_identity, file_sha256, model_name_of, resolve_model
from kvgraft_plugin.core.paths import cache_root
from kvgraft_plugin.library.fingerprint import make_fingerprint
from kvgraft_plugin.library.template import _SLOT, _segments
from kvgraft_plugin.routing.judge_cache import JudgeStarts, StartStore
from kvgraft_plugin.routing.numerals import NUMERALS_PROMPT, numerals_turns, written_numbers
from kvgraft_plugin.routing.rewording import (
    CHANGE,
    KEEP,
    REWORDING_PROMPT,
    REWORDING_THRESHOLD,
    REWORDING_VETO,
    edited,
    log_likelihood,
)
from kvgraft_plugin.routing.text_shape import kept
from kvgraft_plugin.routing.word_guards import unpaired_numbers

__all__ = [
    "CLEAR_YES_RULES",
    "CLOSE_KEPT",
    "CLOSE_MARGIN",
    "DEFAULT_THRESHOLD",
    "JUDGE_N_CTX",
    "JUDGE_PROMPT",
    "SMALL_EDIT",
    "VETO_THRESHOLD",
    "VIEWS",
    "Judge",
    "JudgeVerdict",
    "View",
    "clear_yes",
    "open_judge",
    "pair_bar",
    "pair_threshold",
]

logger = logging.getLogger(__name__)

#: Name of the prompt below; a library's calibrated threshold holds for this prompt only.
JUDGE_PROMPT = "same-problem-v2"

#: The margin threshold of a judge no library calibrated (chosen on examples/judge-dev; see docs/routing-history.md).
DEFAULT_THRESHOLD = -1.0
#: The margin threshold of a judge behind the word guards (``profile="math"``): the guards decide, and the
#: judge only vetoes a clear No. -3.0 is a round margin below the lowest margin of any paraphrase the word
#: guards pass on the math tuning set (-2.77, "89 times 47"); at -1.0 with the clear-Yes bar the judge refused
#: 26 of the 143 questions there that the guards route right (docs/routing-history.md).
VETO_THRESHOLD = -3.0

#: A question that keeps this share of an entry's words, in order, without being the same text, is a small
#: edit of it, and needs a margin of at least `CLOSE_MARGIN`: a clear Yes. The judge overlooks small edits
#: ("highest" for "lowest", "not including" for "including", "CO" for "CO2"). Chosen on examples/edits-dev
#: and the domains sets, where at -1.0 it refused 12 near-misses for 7 paraphrases (none on the domains
#: sets); on the held-out examples/edits, 5 near-misses for 17 paraphrases (docs/routing-history.md). Every small edit
#: whose margin clears the threshold is read again as a rewording (`kvgraft_plugin.routing.rewording`): that passes one
#: short of a clear Yes, or refuses one with a clear Yes.
CLOSE_KEPT = 0.7
CLOSE_MARGIN = 0.0
#: What needs a clear Yes (`clear_yes`), and what reads a small edit again (`kvgraft_plugin.routing.rewording`,
#: `kvgraft_plugin.routing.numerals`), for the keys of cached verdicts that depend on them.
CLEAR_YES_RULES = (
    "small edit", CLOSE_KEPT, CLOSE_MARGIN, "one-sided numbers", REWORDING_PROMPT, REWORDING_THRESHOLD, REWORDING_VETO,
    NUMERALS_PROMPT,
)  # fmt: skip
#: `clear_yes`'s reason for a small edit: one whose margin clears the threshold is read again as a rewording
#: (`kvgraft_plugin.routing.rewording`).
SMALL_EDIT = "a small edit of the entry"


def clear_yes(problem: str, question: str) -> str | None:
    """Why ``question`` needs a clear Yes (`CLOSE_MARGIN`) against an entry whose problem is ``problem``, or
    ``None``: it is a small edit of the problem (it keeps `CLOSE_KEPT` of its tokens in order and changes
    some), or it adds numbers to the problem's or leaves some out (`unpaired_numbers`; one replaced is
    refused before the judge). The judge overlooks both: on the tuning sets, at -1.0, one-sided numbers let
    8 of 102 near-misses through, and at 0 one (docs/routing-history.md)."""
    if CLOSE_KEPT <= kept(problem, question) < 1.0:
        return SMALL_EDIT
    if any(unpaired_numbers(problem, question)):
        return "a question whose numbers do not pair with the entry's"
    return None


def pair_bar(problem: str, question: str, threshold: float, *, vouched: bool = False) -> tuple[float, str | None]:
    """The margin a pair needs and why it was raised: ``(threshold, None)``, or `CLOSE_MARGIN` and the
    reason when that is higher and the pair needs a clear Yes (`clear_yes`). A pair the word guards
    ``vouched`` for (they read its small edits and numbers: ``profile="math"``) keeps ``threshold``."""
    why = clear_yes(problem, question) if threshold < CLOSE_MARGIN and not vouched else None
    return (CLOSE_MARGIN, why) if why is not None else (threshold, None)


def pair_threshold(problem: str, question: str, threshold: float, *, vouched: bool = False) -> float:
    """The margin a pair needs (`pair_bar`)."""
    return pair_bar(problem, question, threshold, vouched=vouched)[0]


_SYSTEM = (
    "You decide whether two problems are the same problem: the same given data and the same question, so that "
    "they have the same answer. Rewording does not matter. Reply Yes or No."
)
_ANSWER_SYSTEM = (
    "You decide whether two problems are the same problem: the same given data and the same question, so that "
    "the answer to the first is also the answer to the second. Rewording does not matter. Reply Yes or No."
)
_INSTRUCTION = "First: {problem}\nSecond: {question}"
#: Worked verdicts shown before every pair (the model's own turns), written for the judge and in no test set:
#: rewordings across registers and languages, and changed units, negations, concepts, asked quantities, orders,
#: roles and operations. Each is (first problem, its answer, second problem, verdict). They are the same for
#: every pair, so their cells are computed once and reused.
_SHOTS: tuple[tuple[str, str | None, str, str], ...] = (
    ("A recipe uses 3 eggs per cake. How many eggs are needed for 4 cakes?", "12 eggs",
     "How many eggs do I need to bake 4 cakes if each cake takes 3 eggs?", "Yes"),
    ("How many minutes are there in 3 hours?", "180 minutes", "How many seconds are there in 3 hours?", "No"),
    ("A car travels 150 km in 3 hours. What is its average speed?", "50 km/h",
     "What average speed does a car reach when it covers 150 km in 3 hours?", "Yes"),
    ("How many of the whole numbers from 1 to 10 are even?", None,
     "How many of the whole numbers from 1 to 10 are not even?", "No"),
    ("What is the simple interest on 1000 dollars at 5% per year for 2 years?", "100 dollars",
     "What is the compound interest on 1000 dollars at 5% per year for 2 years?", "No"),
    ("Combien font 7 fois 8 ?", "56", "Wie viel ist 7 mal 8?", "Yes"),
    ("A box holds 12 pens and costs 6 dollars. What does one pen cost?", "0.50 dollars",
     "A box holds 12 pens and costs 6 dollars. How many pens does one dollar buy?", "No"),
    ("Write a function that returns the largest element of a list.", None,
     "Implement a function giving the maximum value in a list.", "Yes"),
    ("Ein Zug fährt 240 km in 2 Stunden. Wie schnell fährt er im Durchschnitt?", "120 km/h",
     "Mit welcher Durchschnittsgeschwindigkeit legt ein Zug in 2 Stunden 240 km zurück?", "Yes"),
    ("Divide 120 by 8.", "15", "Divide 8 by 120.", "No"),
    ("一个长方形长8米，宽5米。它的面积是多少？", "40平方米", "求长8米、宽5米的长方形的面积。", "Yes"),
    ("A shirt costs 40 dollars and is sold at a 25% discount. What is the sale price?", "30 dollars",
     "A shirt costs 40 dollars and is sold at a 25% markup. What is the selling price?", "No"),
    ("¿Cuántos días hay en 3 semanas?", "21 días", "Si una semana tiene 7 días, ¿cuántos días suman 3 semanas?",
     "Yes"),
    ("How many centimetres are there in 12 inches?", "30.48 cm", "How many inches are there in 12 centimetres?",
     "No"),
    ("A 250 g salt solution contains 50 g of salt. What percentage of the solution is salt?", "20%",
     "A 250 g salt solution contains 50 g of salt. How many grams of water does it contain?", "No"),
    ("8000円の品物に10%の消費税がかかります。税込みの価格はいくらですか。", "8800円",
     "8000円の品物に10%の消費税がかかります。消費税の額はいくらですか。", "No"),
    ("Un tren sale a las 9:15 y llega a las 11:45. ¿Cuánto dura el viaje?", "2 horas y 30 minutos",
     "¿Cuánto tiempo tarda un tren que sale a las 9:15 y llega a las 11:45?", "Yes"),
    ("Dans une classe de 30 élèves, 12 portent des lunettes. Quel pourcentage des élèves porte des lunettes ?",
     "40 %",
     "Dans une classe de 30 élèves, 12 portent des lunettes. Quel pourcentage des élèves ne porte pas de lunettes ?",
     "No"),
    ("Ein Rechteck hat einen Umfang von 30 cm und ist 9 cm lang. Wie breit ist es?", "6 cm",
     "Wie breit ist ein 9 cm langes Rechteck mit 30 cm Umfang?", "Yes"),
    ("Tom is 3 years older than Ann, who is 10. How old is Tom?", "13 years",
     "Ann is 3 years older than Tom, who is 10. How old is Ann?", "No"),
    ("一本书原价50元，打八折后卖多少元？", "40元", "原价50元的书打八折，现价是多少元？", "Yes"),
    ("A tank holds 600 litres and drains at 20 litres per minute. How long until it is empty?", "30 minutes",
     "A tank holds 600 litres and drains at 20 litres per hour. How long until it is empty?", "No"),
    ("What is the mean of 4, 8 and 15?", "9", "Find the average of the numbers 4, 8 and 15.", "Yes"),
)  # fmt: skip
#: With the answer shown, the even-numbers verdict needs numbers whose two counts differ (1 to 10: 5 and 5).
_ANSWER_SHOTS = tuple(
    ("How many of the whole numbers from 1 to 9 are even?", "4",
     "How many of the whole numbers from 1 to 9 are not even?", "No") if i == 3 else shot
    for i, shot in enumerate(_SHOTS)
)  # fmt: skip
_YES, _NO = ("Yes", "yes", " Yes", " yes"), ("No", "no", " No", " no")
#: An answer longer than this (code) is not shown: the problem says what is asked.
_MAX_ANSWER_CHARS = 80


@dataclass(frozen=True)
class View:
    """One way of asking the judge about a pair. The pair's margin is the smallest of its views' margins: a
    view that reads the pair another way catches what the others let through."""

    name: str
    system: str
    shots: tuple[tuple[str, str | None, str, str], ...]
    swapped: bool = False
    """The question is shown first, the entry's problem second."""
    answer: bool = False
    """The entry's answer is shown after its problem (unless it has none or it is long)."""

    def user(self, problem: str, question: str, answer: str | None, *, shot: bool = False) -> str:
        """The user turn that asks about a pair. A worked verdict (``shot``) is never swapped: the views that
        share a prompt start share its shots."""
        if self.answer and answer and len(answer) <= _MAX_ANSWER_CHARS:
            problem = f"{problem}\nAnswer to the first: {answer}"
        first, second = (question, problem) if self.swapped and not shot else (problem, question)
        return _INSTRUCTION.format(problem=first, question=second)


#: The views, in the order they are asked (the first refuses most near-misses; a pair stops at its first
#: margin below the threshold). The first two share their prompt's start, the third has its own.
VIEWS = (
    View("entry-first", _SYSTEM, _SHOTS),
    View("question-first", _SYSTEM, _SHOTS, swapped=True),
    View("with-answer", _ANSWER_SYSTEM, _ANSWER_SHOTS, answer=True),
)


@dataclass(frozen=True)
class JudgeVerdict:
    """What the judge said about one (entry, question) pair."""

    margin: float
    """The "Yes" logit minus the "No" logit (the best of each spelling)."""
    threshold: float
    ms: float
    """Time of this call (0 when cached)."""
    cached: bool

    error: str | None = None
    """Why the model gave no margin (the pair did not fit its context); such a pair does not pass."""
    deferred: bool = False
    """Not judged yet: queued for when the engine is idle (``judge_mode="async"``, `kvgraft_plugin.library.aliases`)."""
    clear_yes: str | None = None
    """Why ``threshold`` was raised to a clear Yes (`clear_yes`), or ``None``."""
    rewording: float | None = None
    """The rewording check's score of a small edit whose margin clears the threshold
    (`kvgraft_plugin.routing.rewording`), or ``None`` when it was not asked."""
    numerals: bool | None = None
    """Whether the model read the numbers the question writes in words as the entry's
    (`kvgraft_plugin.routing.numerals`), or ``None`` when the question changes more than that."""

    @property
    def passed(self) -> bool:
        """The margin clears the threshold and the rewording check does not read a changed problem, or the pair
        is a small edit read as a rewording, or the entry with its numbers written in words that read back as
        its own."""
        if self.error is not None:
            return False
        reworded = self.rewording is not None and self.rewording >= REWORDING_THRESHOLD
        return (self.margin >= self.threshold and not self.vetoed) or reworded or self.numerals is True

    @property
    def vetoed(self) -> bool:
        """The rewording check reads the pair as a changed problem (`REWORDING_VETO`)."""
        return self.rewording is not None and self.rewording < REWORDING_VETO

    @property
    def reason(self) -> str:
        """The verdict in words, for the router's trail."""
        if self.deferred:
            return "the judge's verdict is deferred: judged when the engine is idle (an approval becomes an alias)"
        if self.error is not None:
            return f"the judge could not read the pair: {self.error}"
        why = f" ({self.clear_yes} needs a clear Yes)" if self.clear_yes else ""
        cleared = ">=" if self.margin >= self.threshold else "<"
        reason = f"judge margin {self.margin:+.2f} {cleared} {self.threshold:+.2f}{why}"
        if self.rewording is not None:
            kept = self.rewording >= REWORDING_THRESHOLD
            reason += f"; read as a rewording: {self.rewording:+.2f} {'>=' if kept else '<'} {REWORDING_THRESHOLD:+.2f}"
            if self.vetoed:
                reason += f", and < {REWORDING_VETO:+.2f}: read as a changed problem"
        if self.numerals is not None:
            reason += f"; its numbers in words {'read' if self.numerals else 'do not read'} as the entry's digits"
        return reason


@dataclass
class _Seen:
    """What is known of one pair: its views' margins so far, and its rewording score and numerals reading
    once asked."""

    margins: list[float]
    rewording: float | None = None
    numerals: bool | None = None


class Judge:
    """A same-problem judge on ``backend`` (an instruct model with a chat template).

    Each pair is asked in every view (`VIEWS`), one prompt each; its margin is the smallest. A small edit of
    the entry that the views leave between the threshold and a clear Yes is read again by the rewording check
    (`kvgraft_plugin.routing.rewording`), which decides it; one they give a clear Yes is read too, and refused when
    the check reads a changed problem. A question that only writes the entry's numbers in words passes when
    the model reads them back as the entry's (`kvgraft_plugin.routing.numerals`; one view is still asked, for the
    margin on record).
    The prompts of a view begin with the same start (its instruction and worked verdicts): the start is
    prefilled once and its cells are saved as a state (in ``starts`` too, when given, for the next judge),
    and a prompt of another start than the one in the cells restores that start's state first. A restored
    start continues bitwise like a prefilled one, so a margin does not depend on what was judged before.

    Args:
        backend: a backend of its own (not the engine's: its cells are the judge's scratch space).
        threshold: the margin a pair needs to pass.
        model_id: names the judge model in results and in the library's calibration.
        cache_size: how many (entry, question) pairs' margins are kept.
        views: the views asked, in order.
        starts: where the starts' states are kept between processes (`JudgeStarts`); ``None``: in memory only.
        fingerprint: the runtime that decides the margins (`kvgraft_plugin.library.fingerprint.make_fingerprint`).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        model_id: str = "",
        cache_size: int = 4096,
        views: tuple[View, ...] = VIEWS,
        starts: StartStore | None = None,
        fingerprint: Mapping[str, Any] | None = None,
    ) -> None:
        self.backend, self.threshold, self.model_id, self.views = backend, threshold, model_id, views
        self.fingerprint: dict[str, Any] = dict(fingerprint or {})
        kinds = list(dict.fromkeys((v.system, v.shots) for v in views))
        self._start_of = [f"view-{kinds.index((v.system, v.shots))}" for v in views]
        self._starts: dict[str, tuple[list[int], bytearray]] = {}
        self._store = starts
        self._yes, self._no = self._answer_tokens(_YES), self._answer_tokens(_NO)
        self._fed: list[int] = []  # what the backend's cells hold
        self._cache: OrderedDict[tuple[str, str], _Seen] = OrderedDict()  # what is known of each pair so far
        self._cache_size = cache_size
        # a replaced or truncated model file is refused, never read (`check_unchanged`)
        self._path = getattr(backend, "model_path", None)
        self._identity = None if self._path is None else file_identity(self._path)

    def __call__(
        self,
        problem: str,
        question: str,
        *,
        answer: str | None = None,
        threshold: float | None = None,
        vouched: bool = False,
    ) -> JudgeVerdict:
        """Judge whether ``question`` asks the same problem as an entry whose problem is ``problem`` (and whose
        answer is ``answer``); the pair passes at ``threshold`` (default: the judge's; raised where the pair
        needs a clear Yes unless the word guards ``vouched`` for it, `pair_threshold`). The views are asked
        in order until one's margin is below the threshold (a small edit: below ``threshold`` itself, since
        the rewording check may pass what falls short of a clear Yes); each view of a pair and its rewording
        score are computed once (then cached)."""
        asked = self.threshold if threshold is None else threshold
        key = _key(problem, answer, question)
        seen = self._cache.get(key)
        if seen is None:
            seen = self._cache[key] = _Seen([])
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        t0, computed = time.perf_counter(), False
        bar, why = pair_bar(problem, question, asked, vouched=vouched)
        written = bool(written_numbers(problem, question))
        try:
            while (missing := self._missing(seen, asked, bar, why, written)) is not None:
                if missing == "view":
                    seen.margins.append(self.view_margin(len(seen.margins), problem, question, answer))
                elif missing == "numerals":
                    seen.numerals = self.numerals(problem, question)
                else:
                    seen.rewording = self.rewording(problem, question)
                computed = True
        except ContextOverflowError as exc:
            del self._cache[key]
            ms = (time.perf_counter() - t0) * 1e3
            return JudgeVerdict(float("-inf"), bar, ms, False, str(exc), clear_yes=why)
        ms = (time.perf_counter() - t0) * 1e3 if computed else 0.0
        return dataclasses.replace(self._verdict(seen, asked, bar, why), ms=ms, cached=not computed)

    def known(
        self, problem: str, question: str, answer: str | None, threshold: float, *, vouched: bool = False
    ) -> JudgeVerdict | None:
        """The verdict at ``threshold`` (`pair_threshold`) of a pair already judged far enough to decide it,
        from the cache (``None``: it was not); nothing is computed."""
        seen = self._cache.get(_key(problem, answer, question))
        bar, why = pair_bar(problem, question, threshold, vouched=vouched)
        if seen is None or self._missing(seen, threshold, bar, why, bool(written_numbers(problem, question))):
            return None
        return self._verdict(seen, threshold, bar, why)

    def _missing(self, seen: _Seen, asked: float, bar: float, why: str | None, written: bool) -> str | None:
        """What a verdict at ``asked`` still needs: "numerals" (the reading of a question that ``written`` the
        entry's numbers in words), "view" (the next view's margin), "rewording", or ``None``. The views stop at
        the first margin below the bar (a small edit's: below ``asked``, since the rewording check may pass it
        short of the bar), and after the first where the numerals read back."""
        margins = seen.margins
        if written and seen.numerals is None:
            return "numerals"
        if seen.numerals:
            return None if margins else "view"
        if len(margins) < len(self.views) and (not margins or min(margins) >= (asked if why == SMALL_EDIT else bar)):
            return "view"
        if why == SMALL_EDIT and min(margins) >= asked and seen.rewording is None:
            return "rewording"
        return None

    @staticmethod
    def _verdict(seen: _Seen, asked: float, bar: float, why: str | None) -> JudgeVerdict:
        margin = min(seen.margins)
        rewording = seen.rewording if why == SMALL_EDIT and margin >= asked else None
        return JudgeVerdict(
            margin, bar, 0.0, cached=True, clear_yes=why, rewording=rewording, numerals=seen.numerals
        )  # fmt: skip

    def margin(self, problem: str, question: str, answer: str | None = None) -> float:
        """The pair's margin, every view computed now (no cache)."""
        return min(self.view_margin(i, problem, question, answer) for i in range(len(self.views)))

    def view_margin(self, view: int, problem: str, question: str, answer: str | None = None) -> float:
        """The Yes-minus-No logit margin of one view of a pair, computed now."""
        tokens, n_start = self._prompt(self.views[view], problem, question, answer)
        reuse = self._reach(self._start_of[view], tokens, n_start, len(tokens) - 1)  # the last is always fed
        self._fed = []  # until the prefill below has succeeded
        logits = self.backend.prefill(tokens[reuse:])
        self._fed = tokens
        return float(max(logits[t] for t in self._yes) - max(logits[t] for t in self._no))

    def rewording(self, problem: str, question: str) -> float:
        """The rewording check's score of a pair, computed now (`kvgraft_plugin.routing.rewording`): the
        log-likelihood ratio, kept over changed, of the question's tokens that the edit wrote."""
        problem, question = problem.strip(), question.strip()
        entry = self.backend.tokenize(problem, add_bos=False)
        scores = []
        for rewrite in (KEEP, CHANGE):
            tokens, spans = self._chat(rewrite.turns(problem, question), reply=True)
            n_start, (first, end) = spans[-2][0], spans[-1]
            if end - first > self.backend.n_batch:
                raise ContextOverflowError(f"a question of {end - first} tokens is longer than n_batch")
            reuse = self._reach(rewrite.name, tokens, n_start, first - 1)
            self._fed = []  # until the feeds below have succeeded
            if first - 1 > reuse:
                self.backend.prefill(tokens[reuse : first - 1])
            self.backend.verify(tokens[first - 1 : end - 1])  # output i predicts the question's token i
            self._fed = tokens[: end - 1]
            scores.append([log_likelihood(self.backend.logits(i), t) for i, t in enumerate(tokens[first:end])])
            wrote = edited(entry, tokens[first:end])
        keep, change = scores
        return float(sum(k - c for k, c, w in zip(keep, change, wrote, strict=True) if w))

    def numerals(self, problem: str, question: str) -> bool:
        """Whether the model reads every number ``question`` writes in words as the digits ``problem`` has
        there, computed now (`kvgraft_plugin.routing.numerals`): asked to rewrite each phrase of the question in
        digits, it writes the entry's phrase, each token and then the end of the turn its most likely next
        token. Only a question that changes nothing but the writing of the problem's numbers is read."""
        readings = written_numbers(problem, question)
        for words, digits in readings:
            tokens, spans = self._chat(numerals_turns(words, digits), reply=True)
            n_start, (first, end) = spans[-2][0], spans[-1]
            if end >= len(tokens):  # the template closes no turn: "4" could not be told from "40"
                return False
            reuse = self._reach("numerals", tokens, n_start, first - 1)
            self._fed = []  # until the feeds below have succeeded
            if first - 1 > reuse:
                self.backend.prefill(tokens[reuse : first - 1])
            self.backend.verify(tokens[first - 1 : end])  # output i predicts token first + i; the last, the end
            self._fed = tokens[:end]
            if any(int(self.backend.logits(i).argmax()) != t for i, t in enumerate(tokens[first : end + 1])):
                return False
        return bool(readings)

    def prompt_tokens(self, view: View, problem: str, question: str, answer: str | None = None) -> list[int]:
        """One view's prompt: the model's chat template around the instruction, the texts never special."""
        return self._prompt(view, problem, question, answer)[0]

    def _prompt(self, view: View, problem: str, question: str, answer: str | None) -> tuple[list[int], int]:
        """The prompt's tokens and how many of them are the view's start (all before the pair's own text)."""
        user = view.user(problem.strip(), question.strip(), answer.strip() if answer else None)
        turns = [("system", view.system)]
        for shot_problem, shot_answer, shot_question, verdict in view.shots:
            turns += [("user", view.user(shot_problem, shot_question, shot_answer, shot=True)), ("assistant", verdict)]
        tokens, spans = self._chat([*turns, ("user", user)], reply=False)
        return tokens, spans[-1][0]  # every prompt of the view shares what is before the pair's own text

    def _chat(self, turns: list[tuple[str, str]], *, reply: bool) -> tuple[list[int], list[tuple[int, int]]]:
        """``turns`` through the model's chat template: the tokens, and where each turn's text lies in them. The
        texts are never special (text that mimics a placeholder is dropped, not obeyed). ``reply``: the last
        turn is the model's, and no generation prompt follows it."""
        contents = [_SLOT.sub("", content) for _, content in turns]
        slots = [(role, f"\ue000{i}\ue001") for i, (role, _) in enumerate(turns)]
        rendered = self.backend.render_chat(slots, add_generation_prompt=not reply, name=None)
        tokens: list[int] = []
        spans: list[tuple[int, int]] = []
        for i, segment in enumerate(_segments(rendered, contents)):
            first = len(tokens)
            tokens += self.backend.tokenize(segment.text, add_bos=i == 0, special=segment.special)
            if not segment.special:
                spans.append((first, len(tokens)))
        return tokens, spans

    def _reach(self, kind: str, tokens: list[int], n_start: int, limit: int) -> int:
        """Make the cells hold a prefix of ``tokens[:limit]`` that begins with the start of ``kind`` (its first
        ``n_start`` tokens): restore the start unless they hold it, and drop what follows their longest shared
        prefix. How many positions they keep. Every scoring (a view, the rewording check, the numerals) comes
        through here first, so a replaced or truncated model file is refused before llama.cpp reads it."""
        check_unchanged(self._path, self._identity, "the judge's model")
        start, state = self._start(kind, tokens[:n_start])
        if self._fed[:n_start] != start:  # the cells hold another start
            self._fed = []
            self.backend.restore_state(state, n_start)
            self._fed = list(start)
        reuse = 0
        for a, b in zip(self._fed, tokens[:limit]):
            if a != b:
                break
            reuse += 1
        self.backend.truncate(reuse)
        return reuse

    def _start(self, kind: str, tokens: list[int]) -> tuple[list[int], bytearray]:
        """A start's tokens and the state of its cells: kept, loaded from the store, or prefilled now."""
        known = self._starts.get(kind)
        if known is not None and known[0] == tokens:
            return known
        state = self._store.load(tokens) if self._store is not None else None
        if state is None:
            self._fed = []
            self.backend.reset()
            self.backend.prefill(tokens)
            state = self.backend.capture_state()
            self._fed = list(tokens)
            if self._store is not None:
                self._store.save(tokens, state)
        self._starts[kind] = (tokens, state)
        return tokens, state

    def _answer_tokens(self, spellings: tuple[str, ...]) -> list[int]:
        ids = {ids[0] for s in spellings if len(ids := self.backend.tokenize(s, add_bos=False)) == 1}
        if not ids:
            raise ConfigError("the judge model has no one-token Yes/No answer")
        return sorted(ids)


def _key(problem: str, answer: str | None, question: str) -> tuple[str, str]:
    return hashlib.sha256(f"{problem}\0{answer or ''}".encode()).hexdigest(), question


#: The judge's own context: one pair of problems and the instruction (a long code entry fits too).
JUDGE_N_CTX = 2048


def open_judge(
    model: str | Path,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    n_threads: int | None = None,
    starts_dir: Path | None = None,
) -> Judge:
    """A judge on ``model`` (a catalogue name or a GGUF path), in a context of its own (`JUDGE_N_CTX`).

    The model file is memory-mapped, so a judge on the served model shares its weights' pages. Its prompt
    starts' states are kept in ``starts_dir`` (default: the cache's ``judge/``), so only the first judge of
    this runtime prefills them."""
    path = resolve_model(model)  # an absent model is a `ModelError` before llama.cpp is loaded

    from kvgraft_plugin.adapters.llama_cpp import LlamaBackend  # llama.cpp is imported by adapters only

    config = LlamaConfig(n_ctx=JUDGE_N_CTX)
    config = config.replace(n_threads=n_threads) if n_threads else config
    backend = LlamaBackend(path, config)
    fingerprint = make_fingerprint(
        template=JUDGE_PROMPT, gguf_sha256=file_sha256(path), runtime=backend.runtime_facts(), llama=config
    )
    starts = JudgeStarts(starts_dir or cache_root() / "judge", fingerprint)
    name = model_name_of(path) or path.name
    return Judge(backend, threshold=threshold, model_id=name, starts=starts, fingerprint=fingerprint)
