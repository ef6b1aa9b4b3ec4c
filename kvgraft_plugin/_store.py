"""A library at an fsspec URL (``s3://``, ``gs://``, ``file://``, ...), read and written through a local
mirror.

Reading: `RemoteLibrary.pull` downloads the manifest and its signature on every open, and the index when
the manifest names one the mirror lacks; a state file is fetched on its first use (`ensure`) and kept in
the mirror, least recently used out first past ``budget_bytes``. The mirror is a cache and is trusted no
more than the bucket: every file in it is checked exactly as a local library's is (digests in the
manifest, fingerprint, signature), and a file that fails its check is dropped so that the next use
fetches it again.

Writing: a build writes into the mirror as into a local folder and uploads each state as soon as it is
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
import os
from pathlib import Path
from typing import Any

from ._exceptions import ConfigError, StorageError
from ._state import atomic_write, is_regular_file

__all__ = ["DEFAULT_REMOTE_CACHE_BYTES", "RemoteLibrary", "default_cache_dir", "is_url"]

logger = logging.getLogger(__name__)

#: Byte budget of the states kept in a remote library's mirror.
DEFAULT_REMOTE_CACHE_BYTES = 4 << 30


def is_url(location: str | Path) -> bool:
    """True for an fsspec URL (``scheme://...``); a plain path is a local folder."""
    return isinstance(location, str) and "://" in location


def default_cache_dir() -> Path:
    """Where remote libraries are mirrored: ``$XDG_CACHE_HOME/kvgraft/libraries`` (``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvgraft" / "libraries"


class RemoteLibrary:
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
            self.fs, self.root = url_to_fs(self.url)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"cannot open {self.url}: {exc}") from exc
        except Exception as exc:  # a backend's own error (credentials, configuration): one line, chained
            raise self._error("open", "", exc) from exc
        digest = hashlib.sha256(self.url.encode("utf-8")).hexdigest()[:20]
        self.mirror = Path(cache_dir or default_cache_dir()) / digest
        """The local folder that stands for the URL."""
        self.budget_bytes = budget_bytes

    def _key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

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
        when routing loads it (`kvgraft_plugin._index.VectorIndex.load`), and plain decoding still works."""
        self.mirror.mkdir(parents=True, exist_ok=True)
        try:
            self.fs.invalidate_cache()  # fsspec may have listed the URL before another writer changed it
        except Exception as exc:
            raise self._error("list", "", exc) from exc
        for name in ("manifest.json", "manifest.sig"):
            data = self._get(name)
            if data is None:
                (self.mirror / name).unlink(missing_ok=True)
            else:
                atomic_write(self.mirror / name, data)
        if not (self.mirror / "manifest.json").is_file():
            return False
        index = _index_file(self.mirror / "manifest.json")
        if index is not None and not is_regular_file(self.mirror / index):
            try:
                self.fetch(index)
            except FileNotFoundError:  # said once, with what to do, when routing loads it
                logger.info(
                    "%s names the index %s, which is not there: it cannot route until the index is rebuilt "
                    "(kvgraft build SOURCE --library %s)",
                    self.url,
                    index,
                    self.url,
                )
        return True

    def fetch(self, rel: str) -> None:
        """Download ``rel`` into the mirror (`FileNotFoundError` when the URL lacks it)."""
        data = self._get(rel)
        if data is None:
            raise FileNotFoundError(f"{self.url}/{rel}")
        atomic_write(self.mirror / rel, data)
        logger.info("fetched %s/%s (%d bytes)", self.url, rel, len(data))

    def ensure(self, rel: str) -> None:
        """Have the state file ``rel`` in the mirror: fetch it if absent, then keep the mirror in budget."""
        local = self.mirror / rel
        if is_regular_file(local):  # a symlink or a special file is fetched over, never followed
            os.utime(local)  # most recently used
            return
        self.fetch(rel)
        self.evict(keep=local)

    def evict(self, *, keep: Path | None = None) -> None:
        """Delete the least recently used states until the mirror's states fit the budget."""
        # lstat: a link (dangling or not) in the mirror is measured and removed, never followed
        files = sorted((self.mirror / "states").glob("*.kvg"), key=lambda p: p.lstat().st_mtime)
        total = sum(p.lstat().st_size for p in files)
        for path in files:
            if total <= self.budget_bytes:
                break
            if path != keep:
                total -= path.lstat().st_size
                path.unlink(missing_ok=True)

    def exists(self, rel: str) -> bool:
        """Whether the URL holds ``rel``."""
        try:
            return bool(self.fs.exists(self._key(rel)))
        except Exception as exc:
            raise self._error("look up", rel, exc) from exc

    def upload(self, rel: str) -> None:
        """Copy the mirror's ``rel`` to the URL (one object write: readers see the old or the new bytes)."""
        data = (self.mirror / rel).read_bytes()
        try:
            self.fs.pipe_file(self._key(rel), data)
        except Exception as exc:
            raise self._error("write", rel, exc) from exc

    def delete(self, rel: str) -> None:
        """Remove ``rel`` from the URL and the mirror, if there."""
        (self.mirror / rel).unlink(missing_ok=True)
        try:
            self.fs.rm_file(self._key(rel))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._error("delete", rel, exc) from exc


def _index_file(manifest: Path) -> str | None:
    """The index file a manifest names (None without one); a corrupt manifest is reported by `Library.open`."""
    try:
        data: Any = json.loads(manifest.read_bytes())
        name = data.get("index", {}).get("file")
    except (ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and "/" not in name and name.endswith(".faiss") else None
