"""Least-recently-used caches with a byte budget, after llama-cpp-python's ``llama_cache.py``.

`ByteLRU` is the one interface; it has two implementations:

- `RamLRU`: values in memory (the verified states of `kvgraft_plugin.library.library.RamStateCache`);
- `FileLRU`: files in a folder (the state files fetched into a URL library's mirror, `kvgraft_plugin.library.store`).
  Its order is the files' modification times, so it holds across processes that share the folder.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from kvgraft_plugin.core.statefile import is_regular_file

__all__ = ["ByteLRU", "FileLRU", "RamLRU"]

V = TypeVar("V")


class ByteLRU(ABC, Generic[V]):
    """Values under string keys, kept within ``capacity_bytes``: least recently used out first."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        """The budget, in bytes."""

    @property
    @abstractmethod
    def cache_size(self) -> int:
        """Bytes held now."""

    @abstractmethod
    def get(self, key: str) -> V | None:
        """The value under ``key`` (marked most recently used), or ``None``."""

    @abstractmethod
    def put(self, key: str, value: V) -> None:
        """Hold ``value`` under ``key``, evicting least recently used values to stay within budget."""

    @abstractmethod
    def discard(self, key: str) -> None:
        """Forget ``key`` (nothing happens when it is not held)."""


class RamLRU(ByteLRU[V]):
    """Values in memory, each weighing ``size(value)`` bytes; a value larger than the whole budget is not
    kept. Thread-safe."""

    def __init__(self, capacity_bytes: int, *, size: Callable[[V], int]) -> None:
        super().__init__(capacity_bytes)
        self._size_of = size
        self._items: OrderedDict[str, V] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    @property
    def cache_size(self) -> int:
        """Bytes held now."""
        return self._size

    def get(self, key: str) -> V | None:
        """The value under ``key`` (marked most recently used), or ``None``."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: str, value: V) -> None:
        """Hold ``value``; one larger than the whole budget is not kept (and ``key`` is forgotten)."""
        with self._lock:
            self._pop(key)
            nbytes = self._size_of(value)
            if nbytes > self.capacity_bytes:
                return
            self._items[key] = value
            self._size += nbytes
            while self._size > self.capacity_bytes:
                self._pop(next(iter(self._items)))

    def discard(self, key: str) -> None:
        """Forget ``key``."""
        with self._lock:
            self._pop(key)

    def _pop(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._size -= self._size_of(old)


class FileLRU(ByteLRU[Path]):
    """Files under ``folder`` (a key is a path relative to it) that match ``pattern``, the least recently
    used (oldest modification time) deleted first past the budget. The file just put is kept even when it
    alone is over budget: its caller is about to read it. Links are measured and deleted, never followed.
    Not thread-safe: one thread (the engine's worker) uses it."""

    def __init__(self, folder: Path, capacity_bytes: int, *, pattern: str = "states/*.kvg") -> None:
        super().__init__(capacity_bytes)
        self.folder = folder
        self.pattern = pattern

    def _files(self) -> list[Path]:
        return sorted(self.folder.glob(self.pattern), key=lambda p: p.lstat().st_mtime)

    @property
    def cache_size(self) -> int:
        """Bytes held now."""
        return sum(p.lstat().st_size for p in self._files())

    def get(self, key: str) -> Path | None:
        """The file under ``key``, touched (most recently used); ``None`` when absent or not a regular file
        (a symlink or a special file is fetched over, never followed)."""
        path = self.folder / key
        if not is_regular_file(path):
            return None
        os.utime(path)
        return path

    def put(self, key: str, value: Path) -> None:
        """Account for the file ``value`` (``folder / key``, just written) and delete least recently used
        files until the folder's files fit the budget."""
        files = self._files()
        total = sum(p.lstat().st_size for p in files)
        for path in files:
            if total <= self.capacity_bytes:
                break
            if path != value:
                total -= path.lstat().st_size
                path.unlink(missing_ok=True)

    def discard(self, key: str) -> None:
        """Delete the file under ``key``."""
        (self.folder / key).unlink(missing_ok=True)
