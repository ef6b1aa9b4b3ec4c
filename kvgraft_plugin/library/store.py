"""Where a library's files live: one interface, `Store`, and two implementations.

- `FolderStore`: a local folder. The folder is the library; most methods have nothing to do.
- `UrlStore`: an fsspec URL (``s3://``, ``gs://``, ``file://``, ...), read and written through a local
  mirror.

`kvgraft_plugin.library.library.Library` reads and writes every file in the store's local ``folder`` and calls the
store around that: `Store.pull` on open, `Store.ensure` before reading a state, `Store.discard` for a state
that failed its checks, `Store.publish` after writing a file, `Store.delete` to remove one. It never asks
which store it holds.

A URL, reading: `UrlStore.pull` downloads the manifest and its signature on every open, and the index when
the manifest names one the mirror lacks; a state file is fetched on its first use (`UrlStore.ensure`) and
kept in the mirror, least recently used out first past ``budget_bytes`` (`kvgraft_plugin.library.lru.FileLRU`).
The mirror is a cache and is trusted no more than the bucket: every file in it is checked exactly as a local
library's is (digests in the manifest, fingerprint, signature), and a file that fails its check is dropped
so that the next use fetches it again.

A URL, writing: a build writes into the mirror as into a local folder and uploads each state as soon as it is
written, then the index, and the manifest last (`Library.save`). A reader of the URL therefore sees a
manifest whose every state and index is already there: the previous library, or the new one, never a
half-written one. A killed build leaves the last manifest it uploaded, which names only finished entries,
and a rerun resumes from it.

Credentials and endpoints come from the usual environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
...), read by fsspec's backends, never by kvgraft. Whatever a backend raises (botocore's
``EndpointConnectionError``, an aiohttp error, a refused credential) becomes a one-line `StorageError` naming
the object, with the backend's error as its cause.
"""

from __future__ import annotations

import hashlib
import json
import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from kvgraft_plugin.core.exceptions import ConfigError, StorageError
from kvgraft_plugin.core.paths import cache_root
from kvgraft_plugin.core.statefile import atomic_write, is_regular_file
from kvgraft_plugin.library.lru import FileLRU

__all__ = [
    "DEFAULT_REMOTE_CACHE_BYTES",
    "FolderStore",
    "Store",
    "UrlStore",
    "default_cache_dir",
    "is_url",
    "open_store",
]

logger = logging.getLogger(__name__)

#: Byte budget of the states kept in a remote library's mirror.
DEFAULT_REMOTE_CACHE_BYTES = 4 << 30

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"


def is_url(location: str | Path) -> bool:
    """True for an fsspec URL (``scheme://...``); a plain path is a local folder."""
    return isinstance(location, str) and "://" in location


def default_cache_dir() -> Path:
    """Where remote libraries are mirrored: ``libraries/`` under `kvgraft_plugin.core.paths.cache_root`."""
    return cache_root() / "libraries"


class Store(ABC):
    """Where a library's files live, seen through the local folder ``folder``. ``rel`` is always a path
    relative to the library (``manifest.json``, ``states/<id>.kvg``, ``index-<sha>.faiss``)."""

    folder: Path
    """The local folder the library is read and written in: the library itself, or a URL's mirror."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the library lives, for messages: its folder or its URL."""

    @abstractmethod
    def pull(self) -> bool:
        """Bring ``folder`` up to date (manifest, signature, index); False when there is no manifest."""

    @abstractmethod
    def ensure(self, rel: str) -> None:
        """Have ``rel`` in ``folder`` before it is read (`FileNotFoundError` when the store lacks it)."""

    @abstractmethod
    def exists(self, rel: str) -> bool:
        """Whether the store holds ``rel`` as a file of its own (a symlink or a special file does not count)."""

    @abstractmethod
    def publish(self, rel: str) -> None:
        """Make ``rel``, just written in ``folder``, durable where the library lives."""

    @abstractmethod
    def delete(self, rel: str) -> None:
        """Remove ``rel`` from the library, if there."""

    @abstractmethod
    def discard(self, rel: str) -> None:
        """Drop a local copy of ``rel`` that failed its checks, so that the next `ensure` fetches it again;
        a folder's own file is the library's, and stays for ``kvgraft verify --repair`` to see."""


class FolderStore(Store):
    """A library in a local folder: reads and writes are plain file operations in it."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @property
    def location(self) -> str:
        """The folder."""
        return str(self.folder)

    def pull(self) -> bool:
        """Whether the folder holds a manifest (nothing to fetch)."""
        return (self.folder / MANIFEST).is_file()

    def ensure(self, rel: str) -> None:
        """Nothing to do: reading the file raises `FileNotFoundError` when it is absent."""

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` is a regular file in the folder."""
        return is_regular_file(self.folder / rel)

    def publish(self, rel: str) -> None:
        """Nothing to do: the file is written in the library already."""

    def delete(self, rel: str) -> None:
        """Delete the file."""
        (self.folder / rel).unlink(missing_ok=True)

    def discard(self, rel: str) -> None:
        """Nothing to do: the file is the library's own, not a copy."""


class UrlStore(Store):
    """One library URL and its local mirror. Not thread-safe on its own: the engine's worker uses it."""

    def __init__(
        self, url: str, *, cache_dir: str | Path | None = None, budget_bytes: int = DEFAULT_REMOTE_CACHE_BYTES
    ) -> None:
        try:
            from fsspec.core import url_to_fs
        except ImportError as exc:  # pragma: no cover - fsspec comes with the core dependencies
            raise ImportError("a library URL needs fsspec: pip install fsspec (and s3fs for s3://)") from exc
        self.url = url.rstrip("/")
        try:
            self.fs, self._prefix = url_to_fs(self.url)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"cannot open {self.url}: {exc}") from exc
        except Exception as exc:  # a backend's own error (credentials, configuration): one line, chained
            raise self._error("open", "", exc) from exc
        digest = hashlib.sha256(self.url.encode("utf-8")).hexdigest()[:20]
        self.folder = Path(cache_dir or default_cache_dir()) / digest
        self.states = FileLRU(self.folder, budget_bytes)
        """The fetched states, least recently used out first past ``budget_bytes``."""

    @property
    def location(self) -> str:
        """The URL."""
        return self.url

    def _key(self, rel: str) -> str:
        return f"{self._prefix}/{rel}"

    def _error(self, action: str, rel: str, exc: BaseException) -> StorageError:
        """``exc`` from the storage backend as one line that names the object (chain it with ``from``)."""
        detail = " ".join(str(exc).split()) or "no detail"
        where = f"{self.url}/{rel}" if rel else self.url
        return StorageError(
            f"cannot {action} {where}: {type(exc).__name__}: {detail} "
            "(check the URL, the endpoint such as AWS_ENDPOINT_URL, and the credentials)"
        )

    def _get(self, rel: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self._key(rel)))
        except FileNotFoundError:
            return None
        except Exception as exc:  # backends raise their own network errors, not only OSError
            raise self._error("read", rel, exc) from exc

    def pull(self) -> bool:
        """Refresh the mirror's manifest, signature and index from the URL; False when there is no manifest.

        An index that the manifest names and the URL lacks is not fetched: it is reported, with what to do,
        when routing loads it (`kvgraft_plugin.library.index.VectorIndex.load`), and plain decoding still works."""
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self.fs.invalidate_cache()  # fsspec may have listed the URL before another writer changed it
        except Exception as exc:
            raise self._error("list", "", exc) from exc
        for name in (MANIFEST, SIGNATURE):
            data = self._get(name)
            if data is None:
                (self.folder / name).unlink(missing_ok=True)
            else:
                atomic_write(self.folder / name, data)
        if not (self.folder / MANIFEST).is_file():
            return False
        index = _index_file(self.folder / MANIFEST)
        if index is not None and not is_regular_file(self.folder / index):
            try:
                self._fetch(index)
            except FileNotFoundError:  # said once, with what to do, when routing loads it
                logger.info(
                    "%s names the index %s, which is not there: it cannot route until the index is rebuilt "
                    "(kvgraft build SOURCE --library %s)",
                    self.url,
                    index,
                    self.url,
                )
        return True

    def _fetch(self, rel: str) -> Path:
        """Download ``rel`` into the mirror (`FileNotFoundError` when the URL lacks it)."""
        data = self._get(rel)
        if data is None:
            raise FileNotFoundError(f"{self.url}/{rel}")
        local = self.folder / rel
        atomic_write(local, data)
        logger.info("fetched %s/%s (%d bytes)", self.url, rel, len(data))
        return local

    def ensure(self, rel: str) -> None:
        """Have the state file ``rel`` in the mirror: fetch it if absent, then keep the mirror in budget."""
        if self.states.get(rel) is None:  # a symlink or a special file is fetched over, never followed
            self.states.put(rel, self._fetch(rel))

    def exists(self, rel: str) -> bool:
        """Whether the mirror (a regular file there) or else the URL holds ``rel``."""
        if is_regular_file(self.folder / rel):
            return True
        try:
            return bool(self.fs.exists(self._key(rel)))
        except Exception as exc:
            raise self._error("look up", rel, exc) from exc

    def publish(self, rel: str) -> None:
        """Copy the mirror's ``rel`` to the URL (one object write: readers see the old or the new bytes)."""
        data = (self.folder / rel).read_bytes()
        try:
            self.fs.pipe_file(self._key(rel), data)
        except Exception as exc:
            raise self._error("write", rel, exc) from exc

    def delete(self, rel: str) -> None:
        """Remove ``rel`` from the URL and the mirror, if there."""
        (self.folder / rel).unlink(missing_ok=True)
        try:
            self.fs.rm_file(self._key(rel))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._error("delete", rel, exc) from exc

    def discard(self, rel: str) -> None:
        """Delete the mirror's copy of ``rel`` (a damaged download is fetched again next time)."""
        self.states.discard(rel)


def open_store(
    location: str | Path, *, cache_dir: str | Path | None = None, cache_bytes: int = DEFAULT_REMOTE_CACHE_BYTES
) -> Store:
    """The store of ``location``: a `UrlStore` for an fsspec URL (mirrored under ``cache_dir``, its states
    kept within ``cache_bytes``), else a `FolderStore`."""
    if is_url(location):
        return UrlStore(str(location), cache_dir=cache_dir, budget_bytes=cache_bytes)
    return FolderStore(location)


def _index_file(manifest: Path) -> str | None:
    """The index file a manifest names (None without one); a corrupt manifest is reported by `Library.open`."""
    try:
        data: Any = json.loads(manifest.read_bytes())
        name = data.get("index", {}).get("file")
    except (ValueError, AttributeError, RecursionError):
        return None
    return name if isinstance(name, str) and "/" not in name and name.endswith(".faiss") else None
