"""The judge: an instruct model asked whether a question and an entry's problem are the same problem.

Word lists only know the domains they were written for, and embeddings score a near-miss ("how fast" for
"how long") as high as a paraphrase. An instruct model reads both texts whole, in any domain and language. It
is asked once per (entry, question) pair, in a small context of its own (never the graft's: the graft stays
bitwise text RAG), and scored by the logit margin of "Yes" over "No" after the assistant's turn opens. The
threshold on that margin is a library setting, calibrated from labelled questions (`kvgraft calibrate`).

A prompt that shares its start with the previous one (the instruction, often the entry) reuses those cells:
on this build a prefill split anywhere is bitwise the unsplit one, so a margin does not depend on what was
judged before.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ._backend import Backend
from ._config import LlamaConfig
from ._exceptions import ConfigError, ContextOverflowError
from ._models import model_name_of, resolve_model
from ._template import _SLOT, _segments

__all__ = ["DEFAULT_THRESHOLD", "JUDGE_N_CTX", "JUDGE_PROMPT", "Judge", "JudgeVerdict", "open_judge"]

logger = logging.getLogger(__name__)

#: Name of the prompt below; a library's calibrated threshold holds for this prompt only.
JUDGE_PROMPT = "same-problem-v1"

#: The margin threshold of a judge no library calibrated (measured on examples/judge-dev; see docs/routing.md).
DEFAULT_THRESHOLD = 0.6

_SYSTEM = (
    "You decide whether two problems are the same problem: the same given data and the same question, so that "
    "they have the same answer. Rewording does not matter. Reply Yes or No."
)
_INSTRUCTION = "First: {problem}\nSecond: {question}"
#: Worked verdicts shown before every pair (the model's own turns), written for the judge and in no test set:
#: rewordings across registers and languages, and one changed unit, negation, concept, asked quantity, order
#: or operation. They are the same for every pair, so their cells are computed once and reused.
_SHOTS: tuple[tuple[str, str, str], ...] = (
    ("A recipe uses 3 eggs per cake. How many eggs are needed for 4 cakes?",
     "How many eggs do I need to bake 4 cakes if each cake takes 3 eggs?", "Yes"),
    ("How many minutes are there in 3 hours?", "How many seconds are there in 3 hours?", "No"),
    ("A car travels 150 km in 3 hours. What is its average speed?",
     "What average speed does a car reach when it covers 150 km in 3 hours?", "Yes"),
    ("How many of the whole numbers from 1 to 10 are even?",
     "How many of the whole numbers from 1 to 10 are not even?", "No"),
    ("What is the simple interest on 1000 dollars at 5% per year for 2 years?",
     "What is the compound interest on 1000 dollars at 5% per year for 2 years?", "No"),
    ("Combien font 7 fois 8 ?", "Wie viel ist 7 mal 8?", "Yes"),
    ("A box holds 12 pens and costs 6 dollars. What does one pen cost?",
     "A box holds 12 pens and costs 6 dollars. How many pens does one dollar buy?", "No"),
    ("Write a function that returns the largest element of a list.",
     "Implement a function giving the maximum value in a list.", "Yes"),
    ("Ein Zug fährt 240 km in 2 Stunden. Wie schnell fährt er im Durchschnitt?",
     "Mit welcher Durchschnittsgeschwindigkeit legt ein Zug in 2 Stunden 240 km zurück?", "Yes"),
    ("Divide 120 by 8.", "Divide 8 by 120.", "No"),
    ("一个长方形长8米，宽5米。它的面积是多少？", "求长8米、宽5米的长方形的面积。", "Yes"),
    ("A shirt costs 40 dollars and is sold at a 25% discount. What is the sale price?",
     "A shirt costs 40 dollars and is sold at a 25% markup. What is the selling price?", "No"),
    ("¿Cuántos días hay en 3 semanas?", "Si una semana tiene 7 días, ¿cuántos días suman 3 semanas?", "Yes"),
)  # fmt: skip
_YES, _NO = ("Yes", "yes", " Yes", " yes"), ("No", "no", " No", " no")


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
    """Not judged yet: queued for when the engine is idle (``judge_mode="async"``, `kvgraft_plugin._aliases`)."""

    @property
    def passed(self) -> bool:
        """The margin clears the threshold."""
        return self.error is None and self.margin >= self.threshold

    @property
    def reason(self) -> str:
        """The verdict in words, for the router's trail."""
        if self.deferred:
            return "the judge's verdict is deferred: judged when the engine is idle (an approval becomes an alias)"
        if self.error is not None:
            return f"the judge could not read the pair: {self.error}"
        return f"judge margin {self.margin:+.2f} {'>=' if self.passed else '<'} {self.threshold:+.2f}"


class Judge:
    """A same-problem judge on ``backend`` (an instruct model with a chat template).

    Args:
        backend: a backend of its own (not the engine's: its cells are the judge's scratch space).
        threshold: the margin a pair needs to pass.
        model_id: names the judge model in results and in the library's calibration.
        cache_size: how many (entry, question) margins are kept.
    """

    system, instruction, shots = _SYSTEM, _INSTRUCTION, _SHOTS

    def __init__(
        self, backend: Backend, *, threshold: float = DEFAULT_THRESHOLD, model_id: str = "", cache_size: int = 4096
    ) -> None:
        self.backend, self.threshold, self.model_id = backend, threshold, model_id
        self._yes, self._no = self._answer_tokens(_YES), self._answer_tokens(_NO)
        self._fed: list[int] = []
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._cache_size = cache_size

    def __call__(self, problem: str, question: str, *, threshold: float | None = None) -> JudgeVerdict:
        """Judge whether ``question`` asks the same problem as an entry whose problem is ``problem``; the
        pair passes at ``threshold`` (default: the judge's). Each pair is computed once (then cached)."""
        threshold = self.threshold if threshold is None else threshold
        key = (hashlib.sha256(problem.encode()).hexdigest(), question)
        margin = self._cache.get(key)
        if margin is not None:
            self._cache.move_to_end(key)
            return JudgeVerdict(margin, threshold, 0.0, cached=True)
        t0 = time.perf_counter()
        try:
            margin = self.margin(problem, question)
        except ContextOverflowError as exc:
            return JudgeVerdict(float("-inf"), threshold, (time.perf_counter() - t0) * 1e3, False, str(exc))
        self._cache[key] = margin
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return JudgeVerdict(margin, threshold, (time.perf_counter() - t0) * 1e3, cached=False)

    def known(self, problem: str, question: str) -> float | None:
        """The margin of a pair judged before (still in the cache), or ``None``; nothing is computed."""
        return self._cache.get((hashlib.sha256(problem.encode()).hexdigest(), question))

    def margin(self, problem: str, question: str) -> float:
        """The Yes-minus-No logit margin for one pair, computed now (no cache)."""
        tokens = self.prompt_tokens(problem, question)
        reuse = 0
        for a, b in zip(self._fed, tokens[:-1]):  # the last token is always fed: its logits are the verdict
            if a != b:
                break
            reuse += 1
        self.backend.truncate(reuse)
        self._fed = []  # until the prefill below has succeeded
        logits = self.backend.prefill(tokens[reuse:])
        self._fed = tokens
        return float(max(logits[t] for t in self._yes) - max(logits[t] for t in self._no))

    def prompt_tokens(self, problem: str, question: str) -> list[int]:
        """The judge's prompt: the model's chat template around the instruction, the texts never special."""
        turns = [("system", self.system)]
        for shot_problem, shot_question, verdict in self.shots:
            turns += [
                ("user", self.instruction.format(problem=shot_problem, question=shot_question)),
                ("assistant", verdict),
            ]
        text = self.instruction.format(problem=problem.strip(), question=question.strip())
        turns.append(("user", _SLOT.sub("", text)))  # text that mimics a placeholder is dropped, not obeyed
        contents = [content for _, content in turns]
        slots = [(role, f"\ue000{i}\ue001") for i, (role, _) in enumerate(turns)]
        rendered = self.backend.render_chat(slots, add_generation_prompt=True, name=None)
        tokens: list[int] = []
        for i, segment in enumerate(_segments(rendered, contents)):
            tokens += self.backend.tokenize(segment.text, add_bos=i == 0, special=segment.special)
        return tokens

    def _answer_tokens(self, spellings: tuple[str, ...]) -> list[int]:
        ids = {ids[0] for s in spellings if len(ids := self.backend.tokenize(s, add_bos=False)) == 1}
        if not ids:
            raise ConfigError("the judge model has no one-token Yes/No answer")
        return sorted(ids)


#: The judge's own context: one pair of problems and the instruction (a long code entry fits too).
JUDGE_N_CTX = 2048


def open_judge(model: str | Path, *, threshold: float = DEFAULT_THRESHOLD, n_threads: int | None = None) -> Judge:
    """A judge on ``model`` (a catalogue name or a GGUF path), in a context of its own (`JUDGE_N_CTX`).

    The model file is memory-mapped, so a judge on the served model shares its weights' pages."""
    path = resolve_model(model)  # an absent model is a `ModelError` before llama.cpp is loaded

    from .adapters.llama_cpp import LlamaBackend  # llama.cpp is imported by adapters only

    config = LlamaConfig(n_ctx=JUDGE_N_CTX)
    config = config.replace(n_threads=n_threads) if n_threads else config
    name = model_name_of(path) or path.name
    return Judge(LlamaBackend(path, config), threshold=threshold, model_id=name)
