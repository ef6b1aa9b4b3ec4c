"""Validated, frozen configuration objects.

`LlamaConfig` holds every llama.cpp setting that is pinned for exactness: each of them goes into the
state fingerprint. `EngineConfig` adds routing and generation settings, which do not touch the KV bytes.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from kvgraft_plugin.core.exceptions import ConfigError
from kvgraft_plugin.core.sampling import SAMPLING_FIELDS, SamplingParams

__all__ = ["KV_TYPES", "KV_TYPE_BYTES", "EngineConfig", "LlamaConfig", "RouteMode"]

RouteMode = Literal["auto", "graft", "related", "text-rag", "plain"]
FallbackPolicy = Literal["auto", "raise"]
DecodeMode = Literal["auto", "step", "lookup"]

#: KV cache element types accepted for ``type_k`` / ``type_v``, with their ggml type ids.
KV_TYPES: dict[str, int] = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
#: Bytes per element of each KV type (ggml's block size over its block's bytes).
KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4, "f16": 2, "bf16": 2, "q4_0": 18 / 32, "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32, "q8_0": 34 / 32,
}  # fmt: skip


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """``"module:function"`` to the function it names; `ConfigError` says what is wrong with it."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what} must look like module:function, got {spec!r}")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {what} {spec!r}: {exc}") from exc
    if not callable(func):
        raise ConfigError(f"{what} {spec!r} is not callable")
    return func  # type: ignore[no-any-return]


def check_threshold(value: Any) -> None:
    """A routing threshold is a cosine similarity in [0, 1] (``None``: the library's); NaN is refused."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"threshold must be a number within [0, 1], got {value!r}")


def _default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


@dataclass(frozen=True)
class LlamaConfig:
    """The pinned llama.cpp configuration. Names follow ``llama_cpp.Llama``.

    Every field is part of the compatibility fingerprint of a saved state (conservatively: n_threads,
    n_ctx and n_batch were only proven harmless on a dense model).
    """

    model_path: str | None = None
    """Path to a GGUF file. ``None`` uses the library's model, then the bundled default (Gemma 3 270M)."""
    n_ctx: int = 4096
    """Context length in tokens."""
    n_batch: int = 512
    """Logical batch: prefill is fed in chunks of this many tokens."""
    n_ubatch: int = 512
    """Physical micro-batch. It changed exactness on Gemma 3, so it is pinned."""
    n_threads: int = field(default_factory=_default_threads)
    """CPU threads for decode and prefill."""
    type_k: str = "f16"
    """K cache type, one of `KV_TYPES`."""
    type_v: str = "f16"
    """V cache type, one of `KV_TYPES` (quantized V needs ``flash_attn=True``)."""
    flash_attn: bool = False
    """Flash attention, set explicitly: llama.cpp's "auto" would let the bits depend on the machine."""
    swa_full: bool = True
    """Full-size sliding-window cache. On by default: with a window-sized SWA cache, cells wrap
    around and a restore cannot reproduce their layout (measured on Gemma 3: inexact at 1973 tokens,
    max logit diff 0.49; exact with ``swa_full``). No effect on dense models."""
    n_gpu_layers: int = 0
    """Layers offloaded to a GPU (0 = CPU only)."""
    repack: bool = False
    """llama.cpp's repacked CPU weight layouts (``use_extra_bufts``). Off by default: with them Gemma 3's
    logits for a batch of 4 tokens differ from 4 one-token steps (lookup decoding then cannot be exact),
    and prefill was no faster without llamafile (312 tok/s with, 340 without)."""

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.n_batch > self.n_ctx:  # llama.cpp caps its batch at n_ctx and then aborts on a full chunk
            raise ConfigError(f"n_batch ({self.n_batch}) must not exceed n_ctx ({self.n_ctx}): lower --n-batch too")
        if self.n_ubatch > self.n_batch:
            raise ConfigError(f"n_ubatch ({self.n_ubatch}) must not exceed n_batch ({self.n_batch})")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise ConfigError(f"{name} must be one of {sorted(KV_TYPES)}, got {getattr(self, name)!r}")
        if self.type_v not in ("f16", "f32", "bf16") and not self.flash_attn:
            raise ConfigError("a quantized type_v needs flash_attn=True")
        if self.n_gpu_layers < -1:
            raise ConfigError(f"n_gpu_layers must be >= -1, got {self.n_gpu_layers}")

    def replace(self, **changes: Any) -> LlamaConfig:
        """Return a copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class EngineConfig:
    """Everything a `GraftEngine` needs: the pinned llama.cpp settings plus routing and decoding."""

    llama: LlamaConfig = field(default_factory=LlamaConfig)
    """Pinned llama.cpp settings."""
    embedder: str | None = None
    """sentence-transformers model name or path. ``None`` uses the library's, then bundled MiniLM."""
    threshold: float | None = None
    """Minimum cosine similarity for an entry to be used. ``None``: the library's calibrated value."""
    margin: float | None = None
    """Minimum gap between a candidate's score and the best other entry's (0 disables the check).
    ``None``: the library's (``kvgraft calibrate`` may set one), else 0."""
    guards: bool = True
    """Run the router's structural guards (numbers, code, terms, units, relations, asked quantity): a query
    that shares an entry's words but asks another problem must not graft. Off: cosine similarity alone."""
    match_check: str | Callable[..., bool] | None = None
    """Optional hook ``match_check(question, entry, score) -> bool`` (or ``"module:function"``), run last."""
    judge_model: str | None = None
    """A same-problem judge (`kvgraft_plugin.routing.judge`): a catalogue name or GGUF path of an instruct model,
    asked about every candidate that passes the threshold and the structural guards; ``"off"``: none.
    ``None``: the library's, when ``kvgraft calibrate --judge-model`` recorded one and it is on this machine;
    else the served model itself, when it is an instruct model that passes the judge check
    (`kvgraft_plugin.routing.judge_exam`)."""
    judge_threshold: float | None = None
    """The judge's margin a candidate needs. ``None``: the library's calibrated one for that judge and
    profile, else `kvgraft_plugin.routing.judge.DEFAULT_THRESHOLD` (`VETO_THRESHOLD` with ``profile="math"``)."""
    judge_mode: Literal["inline", "async"] = "async"
    """``async`` (the default): no model judgement on the request's path. A pair the judge has not read is
    decided at once by the word guards (refused when ``guards`` is off) and judged when the engine is idle;
    from then on the judge's verdict decides it, and an approval becomes an alias of the entry, stored in the
    library (`kvgraft_plugin.library.aliases`). ``inline``: a candidate waits for the judge's verdict (4-9 s per
    paraphrase with Qwen2.5-Coder-1.5B on 2 cores)."""
    profile: Literal["none", "math"] | None = None
    """With a judge: ``math`` routes with the English word guards (terms, units, relations, asked quantity),
    and the judge only vetoes what they pass, at `kvgraft_plugin.routing.judge.VETO_THRESHOLD` unless a threshold is
    set or calibrated for the profile. ``None``: the library's, else ``none``. Without a judge the word guards
    always run."""
    neighbors: int = 4
    """How many neighbours the index returns for the router to consider."""
    related: bool | None = None
    """The ``related`` route: a question whose nearest entry is close (at or above the related threshold) but not
    the same problem is answered after that entry's restored state, as a new problem to solve step by step
    (`kvgraft_plugin.library.template.RELATED`). ``None``: as the library's calibration decided (`kvgraft calibrate
    --related` turns it on where it measured more right answers and no more copied ones), else off."""
    max_tokens: int = 64
    """Decode budget per answer."""
    decode: DecodeMode = "auto"
    """``step`` (one token per llama.cpp call), ``lookup`` (tokens drafted from the context, above all the
    grafted entry, verified in batches; exactly step's tokens) or ``auto``: lookup where this build, model
    and settings are proven batch-invariant (`kvgraft doctor --invariance`), else step."""
    max_batch: int = 1
    """Requests decoded together (`kvgraft_plugin.engine.scheduler`): each in a sequence of its own of ``n_ctx``
    positions, one token each per llama.cpp batch. Used only up to the batch measured bitwise equal to
    serving each alone on this build and model (`kvgraft doctor`); 1 serves requests one at a time."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """How each token is chosen (greedy by default). Its fields are also flat settings (``temperature``,
    ``top_p``, ``seed``, ...) of `with_settings` and of every request."""
    stop: tuple[str, ...] | None = None
    """Stop strings; the text ends before the first one. ``None``: the answer format's (the newline for
    ``answer``, the end-of-solution marker for ``solution``). Leading whitespace never stops an answer."""
    answer_format: Literal["answer", "solution"] | None = None
    """How entries and queries are rendered (see `kvgraft_plugin.library.template`). ``None``: the library's,
    else ``answer``. Part of the state fingerprint."""
    template: Literal["text", "chat"] | None = None
    """``text`` (``Problem: … Answer:``, for base models) or ``chat`` (the model's chat template, for
    instruct models). ``None``: the library's, else ``text``. Part of the state fingerprint."""
    chat_template: str | None = None
    """With ``template="chat"``: one of llama.cpp's built-in templates by name (``gemma``, ``chatml``, ...)
    instead of the model's own. ``None``: the library's, else the model's."""
    cache_bytes: int = 1 << 30
    """Byte budget of the in-process LRU of verified state bytes."""
    cache_dir: str | None = None
    """Where a library at a URL is mirrored (``None``: ``~/.cache/kvgraft/libraries``)."""
    disk_cache_bytes: int = 4 << 30
    """Byte budget of the states kept in a URL library's mirror (least recently used out first)."""
    fallback: FallbackPolicy = "auto"
    """``"raise"`` raises `NoMatchError` instead of falling back to plain decoding."""
    key_file: str | None = None
    """HMAC key file; when set, only a correctly signed library is used."""

    def __post_init__(self) -> None:
        check_threshold(self.threshold)
        if self.margin is not None and not 0.0 <= self.margin <= 2.0:
            raise ConfigError(f"margin must be within [0, 2], got {self.margin}")
        if self.judge_threshold is not None and (
            isinstance(self.judge_threshold, bool)
            or not isinstance(self.judge_threshold, (int, float))
            or math.isnan(self.judge_threshold)
        ):
            raise ConfigError(f"judge_threshold must be a number, got {self.judge_threshold!r}")
        if self.judge_mode not in ("inline", "async"):
            raise ConfigError(f"judge_mode must be 'inline' or 'async', got {self.judge_mode!r}")
        if self.profile not in (None, "none", "math"):
            raise ConfigError(f"profile must be 'none' or 'math', got {self.profile!r}")
        if self.neighbors < 1:
            raise ConfigError(f"neighbors must be >= 1, got {self.neighbors}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool) or not 1 <= self.max_batch <= 64:
            raise ConfigError(f"max_batch must be an integer from 1 to 64, got {self.max_batch!r}")
        if self.cache_bytes < 0 or self.disk_cache_bytes < 0:
            raise ConfigError(f"cache budgets must be >= 0, got {self.cache_bytes} and {self.disk_cache_bytes}")
        if self.decode not in ("auto", "step", "lookup"):
            raise ConfigError(f"decode must be 'auto', 'step' or 'lookup', got {self.decode!r}")
        if self.fallback not in ("auto", "raise"):
            raise ConfigError(f"fallback must be 'auto' or 'raise', got {self.fallback!r}")
        if self.answer_format not in (None, "answer", "solution"):
            raise ConfigError(f"answer_format must be 'answer' or 'solution', got {self.answer_format!r}")
        if self.template not in (None, "text", "chat"):
            raise ConfigError(f"template must be 'text' or 'chat', got {self.template!r}")
        if isinstance(self.stop, (str, list)):
            object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))

    def replace(self, **changes: Any) -> EngineConfig:
        """Return a copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def with_settings(self, **settings: Any) -> EngineConfig:
        """Apply flat settings, each to `LlamaConfig`, `SamplingParams` or `EngineConfig` by name; ``None``
        keeps a default.

        This is how the engine's keyword arguments, CLI options and LangChain fields become a config.
        """
        llama_names = {f.name for f in dataclasses.fields(LlamaConfig)}
        engine_names = {f.name for f in dataclasses.fields(EngineConfig)} - {"llama"}
        unknown = set(settings) - llama_names - engine_names - SAMPLING_FIELDS
        if unknown:
            raise ConfigError(f"unknown settings: {sorted(unknown)}")
        given = {k: v for k, v in settings.items() if v is not None}
        llama = self.llama.replace(**{k: v for k, v in given.items() if k in llama_names})
        sampling = given.pop("sampling", self.sampling).replace(
            **{k: v for k, v in given.items() if k in SAMPLING_FIELDS}
        )
        return self.replace(llama=llama, sampling=sampling, **{k: v for k, v in given.items() if k in engine_names})
