"""The judge's prompt starts, saved as states: a new judge restores them instead of prefilling them again.

A view's start (its instruction and worked verdicts, ~1,300 tokens) takes ~20 s to prefill on 2 cores at
the judge's ~60 prompt tokens/s, for every process that opens a judge. Its cells are saved once in the state
format of libraries (`kvgraft_plugin._state`: header, payload, digest), named by the runtime's fingerprint
and the start's tokens, and a start whose file is damaged or of another runtime is prefilled again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ._exceptions import IntegrityError
from ._state import atomic_write, decode_state, encode_state, read_file

__all__ = ["JudgeStarts", "StartStore"]

logger = logging.getLogger(__name__)

_ENTRY_ID = "judge-start"


class StartStore(Protocol):
    """Where a judge keeps its starts' states between processes."""

    def load(self, tokens: Sequence[int]) -> bytearray | None:
        """The state saved for ``tokens`` in this runtime, or ``None``."""
        ...

    def save(self, tokens: Sequence[int], state: bytearray) -> None:
        """Keep ``state``, the cells of ``tokens`` prefilled from an empty cache."""
        ...


class JudgeStarts:
    """Start states in ``folder``, one file per (runtime fingerprint, start tokens).

    Args:
        folder: created on the first save.
        fingerprint: the judge's runtime (`kvgraft_plugin._fingerprint.make_fingerprint`): a state is restored
            only where every setting that changes its bits is the same.
    """

    def __init__(self, folder: Path, fingerprint: Mapping[str, Any]) -> None:
        self.folder, self.fingerprint = folder, dict(fingerprint)

    def path(self, tokens: Sequence[int]) -> Path:
        """The file of a start."""
        key = json.dumps([self.fingerprint, list(tokens)], sort_keys=True, separators=(",", ":"))
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.kvstate"

    def load(self, tokens: Sequence[int]) -> bytearray | None:
        """The saved state of ``tokens``; ``None`` when there is none, or it is damaged or of another runtime
        (then the start is prefilled and saved again)."""
        path = self.path(tokens)
        if not path.is_file():
            return None
        try:
            saved = decode_state(read_file(path))
        except (OSError, IntegrityError) as exc:
            logger.warning("judge start %s is unreadable (%s); prefilling it again", path.name, exc)
            return None
        if saved.entry_id != _ENTRY_ID or list(saved.tokens) != list(tokens) or saved.fingerprint != self.fingerprint:
            logger.warning("judge start %s is another start's or another runtime's; prefilling it again", path.name)
            return None
        return bytearray(saved.payload)

    def save(self, tokens: Sequence[int], state: bytearray) -> None:
        """Write the state of ``tokens`` (atomically; a failed write only costs the next judge a prefill)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path(tokens), encode_state(_ENTRY_ID, list(tokens), self.fingerprint, state))
        except OSError as exc:
            logger.warning("could not save the judge's start in %s: %s", self.folder, exc)
