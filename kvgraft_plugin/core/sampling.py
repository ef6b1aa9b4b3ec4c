"""How the next token is chosen: `SamplingParams`, one value object for the engine, the CLI, the server and
the LangChain classes.

The backend turns it into llama.cpp's own sampler chain (``llama_sampler_chain_init``), in llama.cpp's
order: penalties, top-k, top-p, min-p, temperature, then a seeded draw; ``temperature=0`` ends the chain in
the greedy sampler instead, whose pick is the first maximal logit, as ``np.argmax`` was. A grammar (GBNF,
or a JSON Schema turned into GBNF as llama-cpp-python does) constrains every step.

Every route feeds its whole context (restored or prefilled) to the penalties as history before the first
draw, so that a graft samples exactly as text RAG does at any temperature with a fixed seed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kvgraft_plugin.core.exceptions import ConfigError

__all__ = ["CURATE_SAMPLING", "SAMPLING_FIELDS", "SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings; the defaults decode greedily with no penalties, the engine's behaviour so far."""

    temperature: float = 0.0
    """0 picks the most likely token (greedy); above 0 draws from the softmax at this temperature."""
    top_k: int = 0
    """Keep the k most likely tokens (0: off)."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches p (1: off)."""
    min_p: float = 0.0
    """Drop tokens less likely than ``min_p`` times the most likely one (0: off)."""
    repeat_penalty: float = 1.0
    """Divide the logits of tokens seen in the last ``penalty_last_n`` by this (1: off)."""
    presence_penalty: float = 0.0
    """Subtract this from the logit of every token seen in the window (0: off)."""
    frequency_penalty: float = 0.0
    """Subtract this times its count in the window from a token's logit (0: off)."""
    penalty_last_n: int = 64
    """The penalties' window in tokens, context included (0: no penalty; -1: the whole context)."""
    seed: int = 0
    """Seed of the draw; the same seed gives the same text on every route."""
    grammar: str | None = None
    """A GBNF grammar (root rule ``root``) every decoded token must keep valid; decoding ends when it is
    complete. `kvgraft_plugin.engine.grammar.json_schema_grammar` makes one from a JSON Schema."""

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        for name in ("top_k", "penalty_last_n", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be within (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"min_p must be within [0, 1], got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise ConfigError(f"repeat_penalty must be > 0 (1: off), got {self.repeat_penalty}")
        if self.penalty_last_n < -1:
            raise ConfigError(f"penalty_last_n must be >= -1, got {self.penalty_last_n}")
        if not 0 <= self.seed < 2**32 - 1:  # llama.cpp's LLAMA_DEFAULT_SEED (2**32 - 1) means "random"
            raise ConfigError(f"seed must be within [0, 2**32 - 1), got {self.seed}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ConfigError("grammar must be a non-empty GBNF text")

    @property
    def greedy(self) -> bool:
        """True when the most likely token is always taken."""
        return self.temperature <= 0

    @property
    def penalized(self) -> bool:
        """True when a penalty is on, so the sampler needs the token history."""
        on = self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        return on and self.penalty_last_n != 0

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes`` applied (and validated); ``None`` values keep the current ones."""
        unknown = set(changes) - SAMPLING_FIELDS
        if unknown:
            raise ConfigError(f"not a sampling setting: {sorted(unknown)} (allowed: {sorted(SAMPLING_FIELDS)})")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


#: The names of `SamplingParams`' fields: each is also a keyword of ``GraftEngine.ask``/``stream``.
SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


#: What ``kvgraft curate`` samples with unless told otherwise: top-p and min-p keep its attempts off the
#: vocabulary's tail.
CURATE_SAMPLING = SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05)
