"""Whether a model can judge: a fixed check of labelled pairs, asked once per model and runtime.

With no judge configured and none calibrated in the library, the served model is the router's judge when it
is an instruct model (its GGUF has a chat template) that passes this check. A small instruct model reads the
prompt but says Yes (or No) to everything; the check tells it from a judge before it decides a graft.

The 16 pairs are a seeded sample (``random.Random(28)``, 8 of each) of the router's candidates on the tuning
set ``examples/judge-dev/`` (never a held-out set): 8 paraphrases and 8 near-misses, in English, French,
Spanish and Japanese. A model passes at a threshold when it refuses every near-miss and lets at least half
the paraphrases through. Measured at the default threshold (see docs/routing-history.md): Qwen2.5-Coder-1.5B-Instruct
passes, SmolLM2-135M-Instruct does not. The verdict is kept in the cache, keyed by the judge's runtime
fingerprint, its prompt, the pairs and the threshold, so a model is checked once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvgraft_plugin.core.statefile import atomic_write
from kvgraft_plugin.routing.judge import CLEAR_YES_RULES, JUDGE_PROMPT, Judge

__all__ = ["CHECK_PAIRS", "JudgeCheck", "check_judge"]

logger = logging.getLogger(__name__)

#: (entry problem, entry answer, question, same problem?), from examples/judge-dev/ (qids in the comments).
CHECK_PAIRS: tuple[tuple[str, str, str, bool], ...] = (
    ("Six bird nests contain 4, 7, 3, 5, 9 and 2 eggs. What is the median number of eggs per nest?", "4.5 eggs",
     "A survey of six bird nests recorded clutch sizes of 4, 7, 3, 5, 9 and 2 eggs. Determine the median clutch "
     "size.", True),  # biology-stats-paraphrase-10
    ("Un grifo llena un depósito de 240 litros en 12 minutos. ¿Cuántos litros salen por minuto?",
     "20 litros por minuto",
     "¿Cuántos litros por minuto echa un grifo que en 12 minutos llena un depósito de 240 litros?",
     True),  # spanish-paraphrase-6
    ("A deer population in a forest grew from 400 to 500 animals in one year. By what percentage did it "
     "increase?", "25%",
     "Over one year the number of deer living in a forest rose from 400 to 500. What was the percentage growth?",
     True),  # biology-stats-paraphrase-11
    ("水180 gに食塩20 gを溶かしました。この食塩水の濃度は何%ですか。", "10%",
     "180 gの水に20 gの塩を入れてすべて溶かしました。できた食塩水の濃さは何パーセントですか。",
     True),  # japanese-paraphrase-5
    ("4回のテストの点数は72点、85点、90点、77点でした。平均点は何点ですか。", "81点",
     "平均点は何点ですか。4回受けたテストの点数は、72点、85点、90点、77点です。", True),  # japanese-paraphrase-9
    ("Las temperaturas máximas de una semana fueron 15, 16, 18, 24, 25, 21 y 21 °C. ¿Cuál fue la temperatura "
     "máxima media de la semana?", "20 °C",
     "Esta semana las máximas han sido 15, 16, 18, 24, 25, 21 y 21 °C. ¿Qué máxima hemos tenido de media?",
     True),  # spanish-paraphrase-4
    ("Léa achète 4 croissants à 1,20 euro chacun et paie avec un billet de 10 euros. Combien lui rend-on ?",
     "5,20 euros",
     "Léa paie avec un billet de 10 euros ses 4 croissants à 1,20 euro l'un. Elle récupère combien de monnaie ?",
     True),  # french-paraphrase-2
    ("Trois colocataires partagent à parts égales un loyer de 960 euros par mois. Combien chacun paie-t-il par "
     "an ?", "3840 euros",
     "Trois personnes vivant ensemble divisent équitablement un loyer mensuel de 960 euros. Quelle somme "
     "annuelle chacune verse-t-elle ?", True),  # french-paraphrase-5
    ("Léa achète 4 croissants à 1,20 euro chacun et paie avec un billet de 10 euros. Combien lui rend-on ?",
     "5,20 euros",
     "Léa achète 4 croissants à 1,20 euro chacun et paie avec un billet de 10 euros. Combien coûtent les "
     "croissants ?", False),  # french-near-miss-1
    ("水180 gに食塩20 gを溶かしました。この食塩水の濃度は何%ですか。", "10%",
     "食塩水180 gに食塩20 gが溶けています。この食塩水の濃度は何%ですか。", False),  # japanese-near-miss-5
    ("1個120円のりんごを5個と、1本150円のジュースを2本買いました。代金は全部でいくらですか。", "900円",
     "1個150円のりんごを5個と、1本120円のジュースを2本買いました。代金は全部でいくらですか。",
     False),  # japanese-near-miss-1
    ("Une recette pour 4 personnes demande 300 g de farine. Combien de farine faut-il pour 10 personnes ?",
     "750 g",
     "Une recette pour 4 personnes demande 300 g de farine. Combien de farine faut-il ajouter pour la faire "
     "pour 10 personnes ?", False),  # french-near-miss-8
    ("El corazón de una persona late 18 veces en 15 segundos. ¿Cuántas veces late por minuto?",
     "72 veces por minuto",
     "El corazón de una persona late 18 veces en 15 segundos. ¿Cuántas veces late por hora?",
     False),  # spanish-near-miss-7
    ("Une piscine mesure 10 m de long, 5 m de large et 2 m de profondeur. Combien de litres d'eau contient-elle "
     "quand elle est pleine ?", "100000 litres",
     "Une piscine mesure 10 m de long, 5 m de large et 2 m de profondeur. Quelle est l'aire de son fond ?",
     False),  # french-near-miss-3
    ("A photo 20 cm by 15 cm is glued onto a card 30 cm by 25 cm. What area of the card is not covered by the "
     "photo?", "450 cm^2",
     "A photo 20 cm by 15 cm and a card 30 cm by 25 cm are laid side by side without overlapping. What area do "
     "they cover together?", False),  # geometry-near-miss-12
    ("Trois colocataires partagent à parts égales un loyer de 960 euros par mois. Combien chacun paie-t-il par "
     "an ?", "3840 euros",
     "Trois colocataires partagent à parts égales un loyer de 960 euros par mois. Combien chacun paie-t-il par "
     "mois ?", False),  # french-near-miss-5
)  # fmt: skip


_N_SAME = sum(same for *_, same in CHECK_PAIRS)
_N_DIFFERENT = len(CHECK_PAIRS) - _N_SAME


@dataclass(frozen=True)
class JudgeCheck:
    """A model's margins on `CHECK_PAIRS` at a threshold, as far as the check went: the near-misses first,
    to the first one let through, then the paraphrases, until half of them are let through."""

    model: str
    threshold: float
    same: tuple[float, ...]
    """The paraphrases' margins (a refused one stops at its first view: its margin is that view's)."""
    different: tuple[float, ...]
    """The near-misses' margins."""

    @property
    def passed(self) -> bool:
        """Every near-miss refused and at least half the paraphrases let through."""
        let_through = sum(m >= self.threshold for m in self.same)
        refused = len(self.different) == _N_DIFFERENT and not any(m >= self.threshold for m in self.different)
        return refused and 2 * let_through >= _N_SAME

    @property
    def reason(self) -> str:
        """The check's result in words."""
        same = sum(m >= self.threshold for m in self.same)
        different = sum(m >= self.threshold for m in self.different)
        verdict = "passes" if self.passed else "fails"
        return (
            f"{self.model} {verdict} the judge check at margin {self.threshold:+.2f}: it let through {different} "
            f"of {len(self.different)} near-misses and {same} of {len(self.same)} paraphrases asked (it needs "
            f"none of {_N_DIFFERENT}, and {(_N_SAME + 1) // 2} of {_N_SAME})"
        )


def check_judge(judge: Judge, threshold: float, folder: Path | None = None) -> JudgeCheck:
    """``judge``'s check at ``threshold``: read from ``folder`` when this runtime was checked, else judged now
    (at most 16 pairs) and saved there."""
    path = None if folder is None else folder / f"check-{_key(judge.fingerprint, threshold)}.json"
    if path is not None and path.is_file():
        saved = _saved_check(path, judge, threshold)
        if saved is not None:
            return saved
    logger.info("checking whether %s can judge (once for this model and runtime)", judge.model_id)
    margins: dict[bool, list[float]] = {True: [], False: []}
    needed = (_N_SAME + 1) // 2
    for problem, answer, question, same in sorted(CHECK_PAIRS, key=lambda pair: pair[3]):  # near-misses first
        margins[same].append(judge(problem, question, answer=answer, threshold=threshold).margin)
        if not same and margins[same][-1] >= threshold:
            break  # a near-miss let through: the check has failed
        if same and sum(m >= threshold for m in margins[same]) >= needed:
            break  # enough paraphrases let through: the check has passed
    check = JudgeCheck(judge.model_id, threshold, tuple(margins[True]), tuple(margins[False]))
    if path is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            atomic_write(path, json.dumps(asdict(check)).encode())
        except OSError as exc:
            logger.warning("could not save the judge check in %s: %s", folder, exc)
    return check


def _saved_check(path: Path, judge: Judge, threshold: float) -> JudgeCheck | None:
    """The check saved at ``path`` if it is well formed and its first near-miss's margin is what ``judge``
    computes now, bitwise (a margin is deterministic for a runtime): a cache is never trusted as found, and
    never fails a command. ``None``: check again."""
    try:
        saved = json.loads(path.read_text())
        check = JudgeCheck(str(saved["model"]), float(saved["threshold"]),
                           tuple(map(float, saved["same"])), tuple(map(float, saved["different"])))  # fmt: skip
        if check.threshold != threshold or not check.different or len(check.different) > _N_DIFFERENT:
            raise ValueError("it is not a check at this threshold")
        if len(check.same) > _N_SAME or not all(math.isfinite(m) for m in check.same + check.different):
            raise ValueError("its margins are not the check's")
        problem, answer, question, _ = next(pair for pair in CHECK_PAIRS if not pair[3])
        if judge(problem, question, answer=answer, threshold=threshold).margin != check.different[0]:
            raise ValueError("its first margin is not what this judge computes")
    except (OSError, ValueError, KeyError, TypeError, RecursionError, StopIteration) as exc:
        logger.warning("judge check %s is not used (%s); checking again", path.name, exc)
        return None
    return check


def _key(fingerprint: Mapping[str, Any], threshold: float) -> str:
    """The check's file name: what decides its verdict (runtime, prompt, clear-Yes rules, pairs, threshold)."""
    rule = [JUDGE_PROMPT, *CLEAR_YES_RULES]
    key = json.dumps([dict(fingerprint), rule, CHECK_PAIRS, threshold], sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:32]
