"""The saved-state file: one entry's KV cache with everything needed to trust it.

Layout (little-endian)::

    b"KVGRAFT\\0"   8 bytes   magic
    u32            4 bytes   format version
    u32            4 bytes   header length H
    header         H bytes   UTF-8 JSON: entry id, prefix token ids, fingerprint, payload size
    payload        N bytes   llama.cpp KV state in sequence framing (every cell, see adapters.llama_cpp)
    digest         32 bytes  BLAKE2b-256 of every byte before it, header included

The manifest records the same digest and the file's sha256, so a file cannot be swapped for another
valid one without changing the manifest, which a signature covers. No pickle anywhere.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgraft_plugin.core.exceptions import IncompatibleStateError, IntegrityError

__all__ = [
    "FORMAT_VERSION",
    "SavedState",
    "StateLayout",
    "atomic_write",
    "check_fingerprint",
    "decode_state",
    "encode_state",
    "is_regular_file",
    "read_file",
]

MAGIC = b"KVGRAFT\0"
FORMAT_VERSION = 1
DIGEST_SIZE = 32
_PREAMBLE = struct.Struct("<8sII")
_MAX_HEADER = 64 << 20
_HEADER_KEYS = {"entry_id", "tokens", "fingerprint", "payload_bytes"}


@dataclass(frozen=True)
class SavedState:
    """A decoded, integrity-checked state. ``payload`` is a writable view into the file buffer."""

    entry_id: str
    tokens: tuple[int, ...]
    fingerprint: Mapping[str, Any]
    payload: memoryview = field(repr=False)
    digest: str
    """BLAKE2b-256 of the file, hex."""
    nbytes: int
    """Size of the whole file buffer held in memory."""


@dataclass(frozen=True)
class StateLayout:
    """What a model's sequence state holds, in the order llama.cpp writes it: ``kv_sections`` attention KV
    caches (1 for a dense model, 2 for a sliding-window one: base and SWA cache), then the per-layer
    state of the recurrent layers when ``recurrent`` (every layer of a recurrent model, those beside the
    attention layers of a hybrid)."""

    kv_sections: int
    recurrent: bool = False
    cell_ext: bool = False
    """Each KV cell carries M-RoPE's 2-D position and its token (``llama_kv_cell_ext``)."""

    def describe(self) -> str:
        """The layout in words, for messages."""
        kv = {0: "", 1: "attention KV", 2: "attention KV (base + sliding-window caches)"}.get(
            self.kv_sections, f"{self.kv_sections} attention KV caches"
        )
        if self.cell_ext:
            kv += " with M-RoPE positions"
        return " + ".join(part for part in (kv, "recurrent state" if self.recurrent else "") if part)


def encode_state(
    entry_id: str, tokens: list[int] | tuple[int, ...], fingerprint: Mapping[str, Any], payload: bytes | bytearray
) -> bytearray:
    """Serialise a state file in memory."""
    header = json.dumps(
        {
            "entry_id": entry_id,
            "tokens": list(tokens),
            "fingerprint": dict(fingerprint),
            "payload_bytes": len(payload),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode("utf-8")
    out = bytearray(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header)))
    out += header
    out += payload
    out += hashlib.blake2b(out, digest_size=DIGEST_SIZE).digest()
    return out


def decode_state(buf: bytearray, *, expected_digest: str | None = None) -> SavedState:
    """Check and parse a state file held in ``buf`` (no copy of the payload).

    Raises `IntegrityError` on any mismatch: magic, version, lengths, JSON, digest, or a digest other
    than ``expected_digest`` (the manifest's).
    """
    view = memoryview(buf)
    if len(view) < _PREAMBLE.size + DIGEST_SIZE:
        raise IntegrityError(f"state file too short ({len(view)} bytes)")
    magic, version, header_len = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise IntegrityError("not a kvgraft state file (bad magic)")
    if version != FORMAT_VERSION:
        raise IntegrityError(f"state format version {version}, this kvgraft reads {FORMAT_VERSION}")
    if header_len > _MAX_HEADER or _PREAMBLE.size + header_len + DIGEST_SIZE > len(view):
        raise IntegrityError(f"state header length {header_len} does not fit the file")
    body_end = len(view) - DIGEST_SIZE
    digest = hashlib.blake2b(view[:body_end], digest_size=DIGEST_SIZE).digest()
    if digest != view[body_end:]:
        raise IntegrityError("state checksum mismatch: the file is damaged")
    digest_hex = digest.hex()
    if expected_digest is not None and digest_hex != expected_digest:
        raise IntegrityError("state digest differs from the manifest: the file was replaced")
    header_end = _PREAMBLE.size + header_len
    try:
        header = json.loads(bytes(view[_PREAMBLE.size : header_end]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise IntegrityError("state header is not valid JSON") from exc
    if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
        raise IntegrityError("state header has unexpected fields")
    tokens = header["tokens"]
    if (
        not isinstance(header["entry_id"], str)
        or not isinstance(tokens, list)
        or not tokens
        or not all(type(t) is int and 0 <= t < 1 << 31 for t in tokens)
        or not isinstance(header["fingerprint"], dict)
        or header["payload_bytes"] != body_end - header_end
    ):
        raise IntegrityError("state header fields are malformed or inconsistent")
    return SavedState(
        entry_id=header["entry_id"],
        tokens=tuple(tokens),
        fingerprint=header["fingerprint"],
        payload=view[header_end:body_end],
        digest=digest_hex,
        nbytes=len(view),
    )


def check_fingerprint(saved: Mapping[str, Any], runtime: Mapping[str, Any]) -> None:
    """Raise `IncompatibleStateError` naming every key where ``saved`` differs from ``runtime``."""
    keys = sorted(set(saved) | set(runtime))
    diffs = [f"{k}: {saved.get(k)!r} != {runtime.get(k)!r}" for k in keys if saved.get(k) != runtime.get(k)]
    if diffs:
        raise IncompatibleStateError(
            "state built under another configuration (" + "; ".join(diffs) + "); to graft with these settings, "
            "rebuild it: kvgraft build SOURCE --library DIR --rebuild"
        )


#: How a library file is opened: never through a symlink, and without blocking on a FIFO.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def read_file(path: Path, *, root: Path | None = None) -> bytearray:
    """Read a whole regular file with one ``readinto`` into a writable buffer.

    A symlink or anything but a regular file (a FIFO, a device, a folder) is refused with `IntegrityError`
    before it is opened: a library's files are its own, and a link could make it read a file outside it,
    or a FIFO block the reader. With ``root`` (the library's folder, which ``path`` lies in), no folder between
    them may be a symlink either (a linked ``states/``): the path is opened one folder at a time from
    ``root``, none followed. A missing file raises `FileNotFoundError`."""
    _check_regular(path, os.lstat(path).st_mode)
    try:
        fd = os.open(path, _OPEN_FLAGS) if root is None else _open_under(root, path.relative_to(root))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a symlink since the lstat
            raise IntegrityError(f"{path.name} is a symlink: a library's files must be its own") from exc
        raise
    with open(fd, "rb", buffering=0) as f:
        info = os.fstat(f.fileno())
        _check_regular(path, info.st_mode)  # what was opened, not what the lstat saw
        size = info.st_size
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise IntegrityError(f"{path.name} shrank while being read")
            got += n
    return buf


def _open_under(root: Path, rel: Path) -> int:
    """Open ``root / rel`` for reading, walking its folders from ``root`` without following a symlink."""
    if os.open not in os.supports_dir_fd:  # no dir_fd here (Windows): check each folder, then open
        for depth in range(1, len(rel.parts)):
            if (root / Path(*rel.parts[:depth])).is_symlink():
                raise IntegrityError(f"{rel.parts[depth - 1]}/ is a symlink: a library's folders must be its own")
        return os.open(root / rel, _OPEN_FLAGS)
    folder = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for part in rel.parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise IntegrityError(f"{part}/ is a symlink: a library's folders must be its own") from exc
                raise
            os.close(folder)
            folder = inner
        return os.open(rel.parts[-1], _OPEN_FLAGS, dir_fd=folder)
    finally:
        os.close(folder)


def is_regular_file(path: Path) -> bool:
    """True for a regular file, not through a symlink (`Path.is_file` follows one)."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _check_regular(path: Path, mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise IntegrityError(f"{path.name} is a symlink: a library's files must be its own")
    if not stat.S_ISREG(mode):
        raise IntegrityError(f"{path.name} is not a regular file")


def _create_beside(path: Path) -> tuple[int, Path]:
    """A new, empty temp file in ``path``'s folder, opened for writing. It is created with mode 0666 and the
    kernel takes the process umask off, so library files follow the umask without kvgraft ever changing it
    (``os.umask`` is process-wide: flipping it would race every other thread's file creation)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # another writer's temp file: draw another name
            continue


def atomic_write(path: Path, data: bytes | bytearray | str) -> None:
    """Write ``data`` to a temp file in the same folder, fsync it, then rename it over ``path``."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
