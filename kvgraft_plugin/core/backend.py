"""The `Backend` protocol: what the engine needs from a model runtime, and nothing more.

`kvgraft_plugin.adapters.llama_cpp.LlamaBackend` is the implementation; a test can hand the engine any
object of this shape (``GraftEngine(backend=...)``), as httpx's ``MockTransport`` stands in for the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kvgraft_plugin.core.sampling import SamplingParams
from kvgraft_plugin.core.statefile import StateLayout

__all__ = ["Backend", "BatchBackend", "TokenSampler"]


class TokenSampler(Protocol):
    """Chooses tokens for one request (`SamplingParams`); made by `Backend.sampler`."""

    def sample(self, index: int = -1) -> int:
        """The next token, from the logits of output ``index`` of the last batch fed (``-1``: its last); it
        joins the sampler's history."""

    def close(self) -> None:
        """Free what the sampler holds."""


class Backend(Protocol):
    """One model and one context for a single sequence. Not thread-safe: only the engine's worker calls it."""

    model_path: Path
    arch: str
    n_ctx: int
    n_swa: int
    """Sliding-window size (0: a dense model)."""
    n_vocab: int
    n_past: int
    """Positions held in the cache."""
    n_batch: int
    """The most tokens one `verify` may feed."""
    layout: StateLayout
    """What a captured state holds."""

    def meta(self, key: str) -> str:
        """A GGUF metadata value as a string ("" when absent)."""

    def device(self) -> str:
        """Where the KV cache lives: "cpu" or "gpu"."""

    def runtime_facts(self) -> dict[str, Any]:
        """What the runtime is that changes the bits of a state: the keys of
        `kvgraft_plugin.library.fingerprint.RUNTIME_FACTS` (version, build features, kernels, arch, device)."""

    def check_state(self, payload: bytes | bytearray | memoryview, n_tokens: int) -> None:
        """Refuse bytes that are not a well-formed state of ``n_tokens`` positions for this runtime:
        `IntegrityError` when malformed, `IncompatibleStateError` when made under other KV settings."""

    def tokenize(self, text: str, *, add_bos: bool, special: bool = False) -> list[int]:
        """Token ids of ``text``; special-token syntax is parsed only with ``special`` (template markup)."""

    def render_chat(self, messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool, name: str | None) -> str:
        """``(role, content)`` messages through the model's chat template, or llama.cpp's built-in ``name``."""

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token (may be part of a UTF-8 character)."""

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens."""

    def reset(self) -> None:
        """Empty the cache."""

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed ``tokens`` after the current position; the logits after the last one."""

    def decode(self, token: int) -> None:
        """Feed one decoded token; its logits are kept for the sampler."""

    def verify(self, tokens: Sequence[int]) -> None:
        """Feed ``tokens`` (at most ``n_batch``) as one batch with logits at every position, for the sampler."""

    def truncate(self, n_tokens: int) -> None:
        """Forget every position from ``n_tokens`` on (rejected draft tokens)."""

    def logits(self, index: int = -1) -> np.ndarray:
        """A copy of output ``index``'s logits from the last batch fed."""

    def sampler(self, params: SamplingParams, history: Sequence[int]) -> TokenSampler:
        """A sampler for one request; ``history`` (the context so far) primes its penalties."""

    def capture_state(self) -> bytearray:
        """The sequence's whole KV state."""

    def restore_state(self, payload: bytearray | memoryview, n_tokens: int) -> None:
        """Clear the cache and load ``payload`` holding ``n_tokens`` positions."""

    def close(self) -> None:
        """Free the model and the context."""


class BatchBackend(Backend, Protocol):
    """A `Backend` whose context holds ``n_seq`` sequences, each in a KV stream of its own: every `Backend`
    call acts on the sequence chosen by `use_sequence`, and `decode_batch` feeds several at once."""

    n_seq: int

    def use_sequence(self, seq: int) -> None:
        """Make ``seq`` the sequence every later call acts on."""

    def decode_batch(self, items: Sequence[tuple[int, int]]) -> None:
        """Feed one token to each of several distinct sequences, ``(seq, token)`` pairs, in one batch; the
        sampler's ``sample(i)`` reads item ``i``'s logits."""
