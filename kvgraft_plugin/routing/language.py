"""How far a text is from English, read by a language identifier (py3langid, a naive Bayes model over byte
n-grams, shipped in its wheel: no vocabulary of this package and no download).

The word guards (`kvgraft_plugin.routing.router.DEFAULT_GUARDS`) read English: their stop words, synonyms and key
terms are English words. In another language written in Latin letters they see only "content words" and no
negation they know, so a dropped "tidak" ("not", Indonesian) or "giảm" for "tăng" (down for up, Vietnamese)
passed them all. `english_gap` lets them fail closed there, as `script_guard` does for other scripts.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["ENGLISH_GAP", "english_gap"]

#: A text whose English score is this many nats below its best language's is not English. Over the 3,718
#: problems and questions of the example sets, English texts sit at 0 to 3.93 ("Quick one: 48 × 36 = ?",
#: "Calculate 2^20.") and the others at 14.9 ("rettangolo 12 per 5 cm, area?") to 1,671 (docs/routing-history.md).
ENGLISH_GAP = 10.0


@lru_cache(maxsize=4096)
def english_gap(text: str) -> float:
    """How many nats the identifier scores ``text`` below its likeliest language as English (0.0: English is
    the likeliest)."""
    import py3langid  # its model loads on first use (~1 s)

    scores = dict(py3langid.rank(text))
    return float(max(scores.values()) - scores["en"])
