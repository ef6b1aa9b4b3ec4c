"""Saved states on their way to a restore: checked once per process, then kept in a RAM LRU.

`StateLoader.load` is the one way a state reaches llama.cpp, for requests and tools (``kvgraft verify``)
alike. Order of checks: the entry's build-time fidelity flag and fingerprint (from the manifest, before
any read), the file's digest and header (`Library.read_state`), the token ids against what text RAG feeds
for the entry, then the payload's structure for this runtime (`Backend.check_state`). Any failure raises a
`StateError` whose ``reason`` is the fallback code; nothing unchecked is restored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kvgraft_plugin.core.backend import Backend
from kvgraft_plugin.core.exceptions import IncompatibleStateError, InexactStateError, IntegrityError
from kvgraft_plugin.core.statefile import SavedState, check_fingerprint
from kvgraft_plugin.engine.result import Capture
from kvgraft_plugin.library.library import BaseStateCache, EntryRecord, Library, fingerprint_sha256

__all__ = ["StateLoader", "capture", "restore_diff"]


class StateLoader:
    """The states of one library for one runtime (its fingerprint), checked and cached.

    Args:
        library: where the state files are.
        fingerprint: the runtime's (`kvgraft_plugin.library.fingerprint.make_fingerprint`).
        cache: verified states kept between requests.
        prefix_tokens: the ids text RAG feeds for an entry's prefix (the engine's template, tokenized).
        check_payload: the backend's structural check of a payload (`Backend.check_state`).
    """

    def __init__(
        self,
        library: Library,
        fingerprint: Mapping[str, Any],
        cache: BaseStateCache,
        *,
        prefix_tokens: Callable[[EntryRecord], list[int]],
        check_payload: Callable[[bytes | bytearray | memoryview, int], None],
    ) -> None:
        self.library = library
        self.fingerprint = dict(fingerprint)
        self._fingerprint_sha256 = fingerprint_sha256(fingerprint)
        self.cache = cache
        self._prefix_tokens = prefix_tokens
        self._check_payload = check_payload

    def key(self, record: EntryRecord) -> str:
        """Where ``record``'s verified state is kept in the cache."""
        return f"{self.library.path.resolve()}::{record.id}::{record.state_digest}"

    def load(self, record: EntryRecord, *, cached: bool = True) -> SavedState:
        """``record``'s state, checked; from the cache when it was checked before (``cached=False``: read
        and check it afresh, and leave the cache as it is)."""
        if record.fidelity != "exact":
            raise InexactStateError(
                f"entry {record.id!r} failed its bitwise restore check at build (max diff {record.fidelity_max_diff})"
            )
        if record.fingerprint_sha256 != self._fingerprint_sha256:
            check_fingerprint(self.library.fingerprint, self.fingerprint)  # names the differing settings
            raise IncompatibleStateError(f"entry {record.id!r} was built under another configuration")
        if cached and (hit := self.cache.get(self.key(record))) is not None:
            return hit
        state = self.library.read_state(record, self.fingerprint)
        if list(state.tokens) != self._prefix_tokens(record):
            raise IntegrityError(f"state of {record.id!r} holds other token ids than its text renders to")
        self._check_payload(state.payload, len(state.tokens))
        if cached:
            self.cache.put(self.key(record), state)
        return state

    def forget(self, record: EntryRecord) -> None:
        """Drop ``record``'s cached state (llama.cpp refused it, or it was rebuilt)."""
        self.cache.discard(self.key(record))


def capture(
    backend: Backend, tokens: Sequence[int], *, probe: Sequence[int] | None = None, restore: bytes | None = None
) -> Capture:
    """Prefill ``tokens`` from an empty cache and save the sequence's state.

    With ``probe``, also check that restoring the state (or the bytes ``restore``, saved elsewhere for the
    same tokens) and prefilling ``probe`` gives bitwise the logits of the fresh prefill followed by
    ``probe``. A model whose state layout kvgraft does not know, or has not proven exact, is refused here
    (`ConfigError` from the backend), so a build fails before its first entry instead of its library
    falling back on every request.
    """
    backend.reset()
    backend.prefill(tokens)
    payload = backend.capture_state()
    restored = payload if restore is None else bytearray(restore)
    diff = None if probe is None else restore_diff(backend, tokens, restored, probe, prefilled=True)
    return Capture(payload, diff)


def restore_diff(
    backend: Backend, tokens: Sequence[int], payload: Any, probe: Sequence[int], *, prefilled: bool = False
) -> float:
    """Max |logit diff| between prefill(tokens) + probe and restore(payload) + probe; 0.0 when bitwise equal.

    The reference is always a fresh prefill (``prefilled=True``: the backend holds exactly ``tokens``,
    freshly prefilled, as right after a capture). Nothing is rolled back on a sliding-window cache.
    """
    if not prefilled:
        backend.reset()
        backend.prefill(tokens)
    reference = backend.prefill(probe)
    backend.restore_state(payload, len(tokens))
    grafted = backend.prefill(probe)
    backend.reset()
    if np.array_equal(reference, grafted):
        return 0.0
    diff = float(np.max(np.abs(reference - grafted)))
    return diff if diff > 0 else float("nan")  # unequal but no finite gap: NaNs, never "exact"
