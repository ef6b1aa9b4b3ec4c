"""The judge's prompt starts, saved as states: a new judge restores them instead of prefilling them again.

A view's start (its instruction and worked verdicts, ~1,300 tokens) takes ~20 s to prefill on 2 cores at
the judge's ~60 prompt tokens/s, for every process that opens a judge. Its cells are saved once in the state
format of libraries (`kvgraft_plugin.core.statefile`: header, payload, digest), named by the runtime's fingerprint
and the start's tokens, and a start whose file is damaged or of another runtime is prefilled again.

A state's digest only tells damage: whoever can write the folder could edit the cells and compute the digest
again, and restored cells decide the judge's verdicts. So each file is the state followed by its seal, an
HMAC-SHA256 under a key of this cache (`KEY_FILE`: 32 random bytes, made once with mode 600 beside the
starts), and a start whose seal does not verify, or whose key is not the user's own and private, is refused
and prefilled again. Nothing here ever raises for a cache problem: the worst it costs is a prefill.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kvgraft_plugin.core.exceptions import IntegrityError
from kvgraft_plugin.core.statefile import atomic_write, decode_state, encode_state, read_file

__all__ = ["KEY_FILE", "JudgeStarts", "StartStore"]

logger = logging.getLogger(__name__)

_ENTRY_ID = "judge-start"
#: The key that seals the starts of one folder, in that folder.
KEY_FILE = "starts.key"
_KEY_BYTES = 32
_SEAL_BYTES = hashlib.sha256().digest_size
#: What a seal covers before the state's bytes: a key made for starts signs nothing else.
_SEAL_CONTEXT = b"kvgraft judge start\0"
#: How a key file is opened: never through a symlink, and without blocking on a FIFO.
_KEY_OPEN = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


class StartStore(Protocol):
    """Where a judge keeps its starts' states between processes."""

    def load(self, tokens: Sequence[int]) -> bytearray | None:
        """The state saved for ``tokens`` in this runtime, or ``None``."""
        ...

    def save(self, tokens: Sequence[int], state: bytearray) -> None:
        """Keep ``state``, the cells of ``tokens`` prefilled from an empty cache."""
        ...


class JudgeStarts:
    """Start states in ``folder``, one file per (runtime fingerprint, start tokens), each sealed with the
    folder's key (`KEY_FILE`).

    Args:
        folder: created on the first save (mode 700 when this creates it), with its key.
        fingerprint: the judge's runtime (`kvgraft_plugin.library.fingerprint.make_fingerprint`): a state is restored
            only where every setting that changes its bits is the same.
    """

    def __init__(self, folder: Path, fingerprint: Mapping[str, Any]) -> None:
        self.folder, self.fingerprint = folder, dict(fingerprint)

    def path(self, tokens: Sequence[int]) -> Path:
        """The file of a start."""
        key = json.dumps([self.fingerprint, list(tokens)], sort_keys=True, separators=(",", ":"))
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.kvstate"

    def load(self, tokens: Sequence[int]) -> bytearray | None:
        """The saved state of ``tokens``; ``None`` when there is none, or it is damaged, unsealed, sealed under
        another key or of another runtime (then the start is prefilled and saved again). Never raises for
        what is in the folder."""
        path = self.path(tokens)
        try:
            if not path.is_file():
                return None
            key = self._key(create=False)
            buf = read_file(path)
            if not _sealed(key, buf):
                raise IntegrityError("its seal does not verify under this cache's key")
            del buf[-_SEAL_BYTES:]  # in place: the state is read without a copy
            saved = decode_state(buf)
        except (OSError, ValueError, IntegrityError) as exc:
            logger.warning("judge start %s is not used (%s); prefilling it again", path.name, exc)
            return None
        if saved.entry_id != _ENTRY_ID or list(saved.tokens) != list(tokens) or saved.fingerprint != self.fingerprint:
            logger.warning("judge start %s is another start's or another runtime's; prefilling it again", path.name)
            return None
        return bytearray(saved.payload)

    def save(self, tokens: Sequence[int], state: bytearray) -> None:
        """Write the state of ``tokens``, sealed (atomically; a failed write only costs the next judge a
        prefill)."""
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            key = self._key(create=True)
            data = encode_state(_ENTRY_ID, list(tokens), self.fingerprint, state)
            data += _seal(key, data)
            atomic_write(self.path(tokens), data)
        except (OSError, IntegrityError) as exc:
            logger.warning("could not save the judge's start in %s: %s", self.folder, exc)

    def _key(self, *, create: bool) -> bytes:
        """The folder's key, made first when ``create`` and there is none; `IntegrityError` when it is missing,
        not a regular file of `_KEY_BYTES` bytes, not the user's own, or readable by group or others."""
        path = self.folder / KEY_FILE
        if create and not os.path.lexists(path):
            _make_key(path)
        try:
            fd = os.open(path, _KEY_OPEN)
        except FileNotFoundError as exc:
            raise IntegrityError(f"this cache has no key {path}") from exc
        except OSError as exc:
            reason = "a symlink" if exc.errno == errno.ELOOP else exc.strerror
            raise IntegrityError(f"its key {path} cannot be read ({reason})") from exc
        with open(fd, "rb", buffering=0) as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size != _KEY_BYTES:
                raise IntegrityError(f"its key {path} is not a file of {_KEY_BYTES} bytes")
            if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o077):
                raise IntegrityError(f"its key {path} is not private to this user (owner and mode 600 needed)")
            key = f.read(_KEY_BYTES + 1)
        if len(key) != _KEY_BYTES:
            raise IntegrityError(f"its key {path} changed while it was read")
        return key


def _seal(key: bytes, state: bytes | bytearray | memoryview) -> bytes:
    """The seal of a state file's bytes under ``key``."""
    mac = hmac.new(key, _SEAL_CONTEXT, hashlib.sha256)
    mac.update(state)
    return mac.digest()


def _sealed(key: bytes, buf: bytearray) -> bool:
    """Whether ``buf`` is a state followed by its seal under ``key`` (compared in constant time)."""
    if len(buf) < _SEAL_BYTES:
        return False
    with memoryview(buf) as view, view[: len(buf) - _SEAL_BYTES] as state:  # released: ``buf`` is cut next
        return hmac.compare_digest(_seal(key, state), bytes(view[len(buf) - _SEAL_BYTES :]))


def _make_key(path: Path) -> None:
    """Make the key at ``path``, whole or not at all: written to a temp file created with mode 600 (``O_EXCL``),
    then linked into place, which fails when another process made one first (then that one is used)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with open(fd, "wb", buffering=0) as f:
            f.write(secrets.token_bytes(_KEY_BYTES))
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another judge made it first
    finally:
        tmp.unlink(missing_ok=True)
