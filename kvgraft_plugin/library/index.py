"""Embedding and nearest-neighbour search: sentence-transformers + faiss.

What gets embedded is the entry's **problem** text only: a query is a problem statement, and the
solution text would pull a query towards entries that merely use similar steps. Embeddings are
L2-normalised, so inner product is cosine similarity.

Every row is bound to its entry before the index is used: the manifest records the index file's sha256,
``rows_sha256`` (the file's sha256 and the entry id of each row, in row order: two swapped ids would route a
query to the other entry at score 1.0) and ``problems`` (the problem text each row was embedded from, which
must still be its entry's). Any mismatch raises `IndexMismatchError`. The manifest is signed when a key is
used, so a signature covers all three.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from kvgraft_plugin.core.exceptions import ConfigError, IndexMismatchError, IntegrityError, LibraryError
from kvgraft_plugin.core.models import bundled_embedder_path, file_sha256
from kvgraft_plugin.core.statefile import atomic_write, read_file

if TYPE_CHECKING:
    from kvgraft_plugin.library.library import Library

__all__ = ["SINGLE_ENTRY_THRESHOLD", "Embedder", "Hit", "IndexKind", "VectorIndex", "geometry_threshold", "open_index"]

logger = logging.getLogger(__name__)

IndexKind = Literal["flat", "hnsw"]
INDEX_FILE = "index.faiss"
_INDEX_NAME = re.compile(r"index(?:-[0-9a-f]{16})?\.faiss")


def rows_sha256(file_sha256: str, ids: list[str]) -> str:
    """The digest that binds an index file's rows to their entry ids: sha256 of the file's sha256 and the ids
    in row order."""
    payload = json.dumps({"sha256": file_sha256, "ids": list(ids)}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def stale_index_files(folder: Path, keep: set[str]) -> list[Path]:
    """Index files of ``folder`` other than ``keep`` (the current one and the one before it)."""
    return [p for p in folder.glob("index*.faiss") if _INDEX_NAME.fullmatch(p.name) and p.name not in keep]


class Embedder:
    """A sentence-transformers model on the CPU, identified by name/path and a hash of its files."""

    def __init__(self, name_or_path: str | Path | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging
        except ImportError as exc:
            raise ImportError("routing needs sentence-transformers: pip install sentence-transformers") from exc
        hf_logging.disable_progress_bar()  # no "Loading weights" bar on every command
        path = Path(name_or_path) if name_or_path is not None else bundled_embedder_path()
        self.name = str(name_or_path) if name_or_path is not None else "bundled:all-MiniLM-L6-v2"
        try:
            self._model = SentenceTransformer(str(path) if path.exists() else str(name_or_path), device="cpu")
        except OSError as exc:
            raise ConfigError(f"cannot load sentence-transformers model {self.name!r}: {exc}") from exc
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(get_dim() or 0)
        self.files_sha256 = _dir_sha256(path) if path.is_dir() else ""
        self._lock = threading.Lock()

    @classmethod
    def for_library(cls, library: Library | None, name_or_path: str | Path | None = None) -> Embedder:
        """``name_or_path`` if given, else the embedder the library was indexed with."""
        if name_or_path is None and library is not None:
            stored = library.embedder.get("name") or ""
            name_or_path = None if not stored or stored.startswith("bundled:") else stored
        return cls(name_or_path)

    @property
    def identity(self) -> dict[str, Any]:
        """What the index records and checks: a different embedder would route to wrong entries."""
        return {"name": self.name, "files_sha256": self.files_sha256, "dim": self.dim}

    def encode(self, texts: list[str]) -> np.ndarray:
        """Normalised float32 embeddings, one row per text."""
        with self._lock:
            vectors = self._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        return np.ascontiguousarray(vectors, dtype=np.float32)


def _dir_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{file.relative_to(path)}\0{file_sha256(file)}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Hit:
    """One neighbour: an entry id and its cosine similarity to the query."""

    entry_id: str
    score: float


class VectorIndex:
    """A faiss inner-product index over entry embeddings, with the entry id of each row."""

    def __init__(self, dim: int, kind: IndexKind = "flat") -> None:
        import faiss

        self._index: Any
        if kind == "flat":
            self._index = faiss.IndexFlatIP(dim)
        elif kind == "hnsw":
            self._index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
            self._index.hnsw.efSearch = 64
        else:
            raise ConfigError(f"index must be 'flat' or 'hnsw', got {kind!r}")
        self.kind: IndexKind = kind
        self.dim = dim
        self.ids: list[str] = []

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, ids: list[str], vectors: np.ndarray) -> None:
        """Append rows; ids must be new."""
        if vectors.shape != (len(ids), self.dim):
            raise ConfigError(f"expected {len(ids)}x{self.dim} vectors, got {vectors.shape}")
        clash = set(ids) & set(self.ids)
        if clash:
            raise ConfigError(f"ids already indexed: {sorted(clash)}")
        self._index.add(vectors)
        self.ids.extend(ids)

    def search(self, vector: np.ndarray, k: int) -> list[Hit]:
        """The ``k`` nearest entries, best first."""
        if not self.ids:
            return []
        scores, rows = self._index.search(vector.reshape(1, -1).astype(np.float32), min(k, len(self.ids)))
        return [Hit(self.ids[r], float(s)) for s, r in zip(scores[0], rows[0]) if r >= 0]

    def vectors(self) -> np.ndarray:
        """All rows, in id order (flat and HNSW indexes both keep them)."""
        return np.asarray(self._index.reconstruct_n(0, len(self.ids)), dtype=np.float32)

    def save(self, folder: Path) -> dict[str, Any]:
        """Write ``index.faiss`` atomically; return its manifest record (kind, file, sha256, ids, rows_sha256)."""
        import faiss

        data = faiss.serialize_index(self._index).tobytes()
        sha256 = hashlib.sha256(data).hexdigest()
        # named by its content: a reader holding the previous manifest still finds the previous index
        name = f"index-{sha256[:16]}.faiss"
        atomic_write(folder / name, data)
        ids = list(self.ids)
        return {"kind": self.kind, "file": name, "sha256": sha256, "ids": ids, "rows_sha256": rows_sha256(sha256, ids)}

    @classmethod
    def load(cls, folder: Path, record: dict[str, Any], dim: int, *, location: str | None = None) -> VectorIndex:
        """Read the index and check it against its manifest record; raise `LibraryError` if it differs, and
        `IndexMismatchError` if its rows are not bound to the record's ids (``rows_sha256``, when the record
        has one). ``location`` names the library in messages (default: ``folder``)."""
        import faiss

        where = location or str(folder)
        name = record.get("file", INDEX_FILE)
        if not isinstance(name, str) or not _INDEX_NAME.fullmatch(name):
            raise LibraryError(f"index file name {name!r} is not a file of the library")
        path = folder / name
        try:
            data = bytes(read_file(path))
        except IntegrityError as exc:  # a symlink or a special file: refused unread
            raise LibraryError(f"index file {name} of {where} is refused: {exc}") from exc
        except FileNotFoundError as exc:
            raise LibraryError(
                f"the index file {name} that the manifest names is missing from {where}; rebuild it: "
                f"kvgraft build SOURCE --library {where}"
                + ("" if "://" in where else f" (or kvgraft verify --repair --library {where})")
            ) from exc
        except OSError as exc:
            raise LibraryError(f"index file {name} of {where} cannot be read: {exc.strerror or exc}") from exc
        sha256 = hashlib.sha256(data).hexdigest()
        if sha256 != record.get("sha256"):
            raise LibraryError(f"index file {path} does not match its sha256 in the manifest")
        if "rows_sha256" in record and record["rows_sha256"] != rows_sha256(sha256, record.get("ids", [])):
            raise IndexMismatchError(
                f"an index row is not its entry: the manifest of {where} lists other ids than the index rows "
                f"were built for (rows_sha256 differs); rebuild the index: kvgraft build SOURCE --library {where}"
            )
        try:
            raw = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError as exc:
            raise LibraryError(f"index file {path} is corrupt: {exc}") from exc
        index = cls(dim, record.get("kind", "flat"))
        if raw.d != dim or raw.ntotal != len(record.get("ids", [])):
            raise IndexMismatchError(
                f"index has {raw.ntotal} rows of dim {raw.d}; the manifest expects "
                f"{len(record.get('ids', []))} of dim {dim}"
            )
        index._index = raw
        index.ids = list(record["ids"])
        return index


#: Threshold of a library too small to have a geometry (fewer than two entries).
SINGLE_ENTRY_THRESHOLD = 0.6
GEOMETRY_BOUNDS = (0.5, 0.8)


def geometry_threshold(index: VectorIndex) -> float:
    """A routing threshold from the library's own geometry, used until ``kvgraft calibrate`` sets one.

    Each entry's similarity to its nearest *other* entry says how alike the library's problems are: a
    library of look-alike problems (code tasks, one kind of arithmetic) gets uncovered in-domain queries
    that score high too. The threshold is the median of those nearest-neighbour similarities, kept within
    `GEOMETRY_BOUNDS`; a library of one entry gets `SINGLE_ENTRY_THRESHOLD`.
    """
    if len(index) < 2:
        return SINGLE_ENTRY_THRESHOLD
    vectors = index.vectors()
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    low, high = GEOMETRY_BOUNDS
    return round(float(np.clip(np.median(sims.max(axis=1)), low, high)), 4)


def open_index(library: Library, embedder: Embedder) -> VectorIndex:
    """Load ``library``'s index after checking it was built by ``embedder`` and that each row is its entry's.

    A different embedder, rows bound to other ids, or a row embedded from another problem than its entry's
    would silently route queries to wrong entries, so each is refused with `IndexMismatchError`. An index
    from before ``rows_sha256`` is used as it is, with a warning.
    """
    stored, current = library.embedder, embedder.identity
    if stored and (stored.get("dim") != current["dim"] or stored.get("files_sha256") != current["files_sha256"]):
        raise IndexMismatchError(
            f"the library was indexed with embedder {stored.get('name')!r}; "
            f"{current['name']!r} would route to wrong entries (rebuild with --embedder)"
        )
    where = library.location
    index = VectorIndex.load(library.path, library.index, current["dim"], location=where)
    if "rows_sha256" not in library.index:
        logger.warning(
            "the index of %s has no digest binding its rows to their entries (built by an older kvgraft): "
            "swapped rows would go unnoticed until kvgraft verify; run kvgraft build SOURCE --library %s "
            "to record one",
            where,
            where,
        )
    problems = library.index.get("problems")
    if isinstance(problems, dict):
        for row, entry_id in enumerate(index.ids):
            record = library.entries.get(entry_id)
            if record is not None and problems.get(entry_id) != record.entry.problem:
                raise IndexMismatchError(
                    f"an index row is not its entry: row {row} ({entry_id!r}) was embedded from another "
                    f"problem than the entry's; rebuild the index: kvgraft build SOURCE --library {where}"
                )
    return index
