"""The library on disk: a manifest, one state file per entry, a faiss index, an optional signature.

    LIBRARY/
      manifest.json     entries (text, prefix token ids, state sha256/digest, fidelity), model, fingerprint,
                        embedder identity, index sha256, routing settings, aliases (`_aliases`)
      manifest.sig      HMAC-SHA256 of manifest.json (``kvgraft sign``)
      states/<id>.kvg   saved KV states (see _state)
      index.faiss       the embedding index (faiss native format, never pickled)

The manifest keeps every entry's source text and prefix token ids outside the state file, so text RAG
and rebuilds still work when a state file is damaged or stale. Every write is atomic.

Every file is read and written in the library's local folder ``path``, and its `kvgraft_plugin.library.store.Store`
is told around that (fetch before a read, publish after a write): a folder's store has nothing to do, a URL's
(``s3://bucket/lib``) mirrors the URL in ``path``. Every check below applies to the mirror's files unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from kvgraft_plugin.core.exceptions import (
    ConfigError,
    EntryNotFoundError,
    IntegrityError,
    KVGraftError,
    LibraryError,
    SourceError,
)
from kvgraft_plugin.core.statefile import SavedState, atomic_write, check_fingerprint, decode_state, read_file
from kvgraft_plugin.library.aliases import Alias, parse_aliases, parse_revoked
from kvgraft_plugin.library.lru import ByteLRU, RamLRU
from kvgraft_plugin.library.store import DEFAULT_REMOTE_CACHE_BYTES, MANIFEST, SIGNATURE, FolderStore, Store, open_store
from kvgraft_plugin.library.template import FORMATS, TEMPLATES, AnswerFormat, Entry, TemplateKind

__all__ = ["BaseStateCache", "EntryRecord", "Library", "RamStateCache", "load_key", "read_queries", "read_source"]

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
MIN_KEY_BYTES = 32
Fidelity = Literal["exact", "inexact"]


@dataclass(frozen=True)
class EntryRecord:
    """What the manifest knows about one entry."""

    entry: Entry
    tokens: tuple[int, ...]
    """Prefix token ids (preamble + entry), exactly what text RAG prefills."""
    state_file: str
    """Path of the state file, relative to the library."""
    state_sha256: str
    state_digest: str
    """BLAKE2b-256 of the state file, checked on every cold load."""
    state_bytes: int
    fingerprint_sha256: str
    """sha256 of the fingerprint the state was built under."""
    source_sha256: str
    """sha256 of the entry's source JSON: a change means a rebuild."""
    fidelity: Fidelity
    """Result of the bitwise restore check made at build time."""
    fidelity_max_diff: float = 0.0

    @property
    def id(self) -> str:
        """The entry id."""
        return self.entry.id

    def to_json(self) -> dict[str, Any]:
        """JSON form for the manifest."""
        out = asdict(self)
        out["entry"] = self.entry.to_json()
        out["tokens"] = list(self.tokens)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EntryRecord:
        """Parse a manifest record; raises `LibraryError` when malformed (wrong types, a path outside states/)."""
        try:
            fields = dict(data)
            fields["entry"] = parse_entry(fields["entry"])
            fields["tokens"] = tuple(_typed(t, int, "tokens") for t in fields["tokens"])
            for name in ("state_file", "state_sha256", "state_digest", "fingerprint_sha256", "source_sha256"):
                _typed(fields[name], str, name)
            _typed(fields["state_bytes"], int, "state_bytes")
            fields["fidelity_max_diff"] = float(
                _typed(fields.get("fidelity_max_diff", 0.0), (int, float), "fidelity_max_diff")
            )
            if fields["fidelity"] not in ("exact", "inexact"):
                raise ValueError(f"fidelity must be 'exact' or 'inexact', got {fields['fidelity']!r}")
            if not _STATE_FILE.fullmatch(fields["state_file"]):
                raise ValueError(f"state_file must be a file under states/, got {fields['state_file']!r}")
            return cls(**fields)
        except (KeyError, TypeError, ValueError) as exc:
            raise LibraryError(f"malformed manifest record: {exc}") from exc


#: Every path a manifest names stays inside the library: a plain file name under ``states/``.
_STATE_FILE = re.compile(r"states/[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*\.kvg")


def _typed(value: Any, kind: type | tuple[type, ...], name: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{name} has the wrong type: {value!r}")
    return value


def state_file_name(entry_id: str) -> str:
    """Where an entry's state lives: a hash of its id, so that no id can name a path."""
    return f"states/{hashlib.sha256(entry_id.encode('utf-8')).hexdigest()[:32]}.kvg"


def loads_json(text: str | bytes) -> Any:
    """``json.loads`` that refuses duplicate keys (which would silently keep the last value), and JSON nested too
    deeply for Python's parser, with a ``ValueError`` either way (never a ``RecursionError``)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def visible(text: str) -> bool:
    """True when ``text`` has a character that is neither whitespace nor invisible formatting (zero-width...)."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cf", "Cc", "Zs") for ch in text)


def check_text(value: Any, name: str) -> str:
    """A non-empty, visible, UTF-8-encodable string, or `ValueError` saying which field is wrong."""
    if not isinstance(value, str) or not visible(value):
        raise ValueError(f"'{name}' must be a non-empty string with visible text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"'{name}' is not valid Unicode (a lone surrogate?)") from exc
    return value


def source_sha256(entry: Entry) -> str:
    """Hash of an entry's source text: a change triggers a rebuild."""
    return hashlib.sha256(json.dumps(entry.to_json(), sort_keys=True).encode("utf-8")).hexdigest()


def fingerprint_sha256(fingerprint: Mapping[str, Any]) -> str:
    """Stable hash of a fingerprint dict."""
    return hashlib.sha256(json.dumps(dict(fingerprint), sort_keys=True).encode("utf-8")).hexdigest()


def _index_record(record: Any) -> dict[str, Any]:
    """The manifest's index record, type-checked (an empty one: no index written yet)."""
    if not isinstance(record, dict):
        raise ValueError("'index' must be an object")
    if not record:
        return {}
    if record.get("kind") not in ("flat", "hnsw"):
        raise ValueError(f"index kind must be 'flat' or 'hnsw', got {record.get('kind')!r}")
    for name in ("file", "sha256"):
        _typed(record.get(name), str, f"index {name}")
    if "rows_sha256" in record:  # absent in an index from before it (`_index.open_index` warns)
        _typed(record["rows_sha256"], str, "index rows_sha256")
    ids = record.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError("index ids must be a list of strings")
    problems = record.get("problems", {})
    if not isinstance(problems, dict):
        raise ValueError("index problems must be an object")
    return dict(record)


def _routing(data: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's routing record; a library from before it kept only ``threshold``."""
    routing = data.get("routing")
    if routing is None:
        threshold = data.get("threshold")
        return {} if threshold is None else {"threshold": threshold, "margin": 0.0, "source": "user"}
    if not isinstance(routing, dict):
        raise ValueError("'routing' must be an object")
    for name in ("threshold", "margin"):
        value = routing.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not -1 <= value <= 2
        ):
            raise ValueError(f"routing {name} must be a number within [-1, 2], got {value!r}")
    judge = routing.get("judge")
    if judge is not None and not (
        isinstance(judge, dict)
        and isinstance(judge.get("model"), str)
        and isinstance(judge.get("threshold"), (int, float))
        and not isinstance(judge.get("threshold"), bool)
    ):
        raise ValueError(f"routing judge must be an object with a model and a numeric threshold, got {judge!r}")
    return dict(routing)


def _answer_format(value: Any) -> AnswerFormat:
    if value not in FORMATS:
        raise ValueError(f"answer_format must be one of {', '.join(FORMATS)}, got {value!r}")
    return value  # type: ignore[no-any-return]


def _template_kind(value: Any) -> TemplateKind:
    if value not in TEMPLATES:
        raise ValueError(f"template must be one of {', '.join(TEMPLATES)}, got {value!r}")
    return value  # type: ignore[no-any-return]


def _optional_text(value: Any, name: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


# -- source files -------------------------------------------------------------------------------------

#: Ids are any visible text up to this many characters ("HumanEval/0", "tâche 3: somme"); state files
#: are named by a hash of the id, so an id never names a path.
MAX_ID_CHARS = 256


def check_id(entry_id: Any) -> str:
    """An entry id: a string of 1 to `MAX_ID_CHARS` characters, not only whitespace, valid UTF-8, without
    control characters (a newline or an escape sequence in an id would forge lines in logs and tables) nor
    format characters (Unicode category Cf: a bidirectional override such as U+202E, a zero-width space or
    joiner, a BOM would make one id display as another)."""
    check_text(entry_id, "id")
    if len(entry_id) > MAX_ID_CHARS:
        raise ValueError(f"'id' must be at most {MAX_ID_CHARS} characters, got {len(entry_id)}")
    if any(unicodedata.category(c) in ("Cc", "Cf") for c in entry_id):
        raise ValueError(
            f"'id' must not contain control characters or format characters (bidirectional overrides, "
            f"zero-width characters), got {ascii(entry_id)}"
        )
    return entry_id


def parse_entry(obj: Any) -> Entry:
    """Validate one source object ``{"id", "problem", "solution", "answer"?, "tags"?, "tests"?}``."""
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    unknown = set(obj) - {"id", "problem", "solution", "answer", "tags", "tests"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    entry_id = check_id(obj.get("id"))
    for name in ("problem", "solution"):
        check_text(obj.get(name), name)
    answer = obj.get("answer")
    if answer is not None:
        check_text(answer, "answer")
    tags = obj.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError("'tags' must be a list of strings")
    for tag in tags:
        check_text(tag, "tags")
    tests = obj.get("tests")
    if tests is not None:
        check_text(tests, "tests")
    return Entry(entry_id, obj["problem"], obj["solution"], answer, tuple(tags), tests)


T = TypeVar("T")


def read_jsonl(path: str | Path, parse: Callable[[Any], T], *, what: str, items: str) -> list[tuple[int, T]]:
    """Every non-blank line of the JSONL file ``path`` as ``(line number, parse(object))``.

    ``parse`` raises `ValueError` for an object it refuses. Any failure is a `SourceError` that names the file
    and the line (``{path}:{line}: ...``); duplicate JSON keys are refused, and so is a file with no line
    (``{path}: no {items}``). ``what`` names the file in a read error (``cannot read {what} {path}``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read {what} {path}: {exc}") from exc
    rows: list[tuple[int, T]] = []
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, parse(loads_json(line.decode("utf-8")))))
        except UnicodeDecodeError as exc:
            raise SourceError(f"{path}:{lineno}: not valid UTF-8") from exc
        except ValueError as exc:
            raise SourceError(f"{path}:{lineno}: {exc}") from exc
    if not rows:
        raise SourceError(f"{path}: no {items}")
    return rows


def _unique_ids(path: str | Path, rows: list[tuple[int, T]], id_of: Callable[[T], str]) -> list[T]:
    """The rows' values; a second row with the same id is a `SourceError` naming both lines."""
    seen: dict[str, int] = {}
    for lineno, row in rows:
        row_id = id_of(row)
        if row_id in seen:
            raise SourceError(f"{path}:{lineno}: duplicate id {row_id!r} (first on line {seen[row_id]})")
        seen[row_id] = lineno
    return [row for _, row in rows]


def read_source(path: str | Path) -> list[Entry]:
    """Read a JSONL library source. Errors name the line; duplicate ids are refused."""
    path = Path(path)
    return _unique_ids(path, read_jsonl(path, parse_entry, what="source", items="entries"), lambda entry: entry.id)


#: Optional query fields that kvgraft reads, each a string or null: the expected answer, the entry the
#: query should route to (``null``: none), its kind (``repeat``, ``near-miss``...), tests for its code.
QUERY_TEXT_FIELDS = ("answer", "expect_entry", "kind", "tests")


def parse_query(obj: Any) -> dict[str, Any]:
    """Validate one query object ``{"id", "question", "answer"?, "expect_entry"?, "kind"?, "tests"?, ...}``;
    other fields are kept as they are. An empty question is allowed: it is answered by an error row."""
    if not isinstance(obj, dict):
        raise ValueError('expected {"id": str, "question": str, ...}')
    check_id(obj.get("id"))  # a query's id is printed in tables and logs as an entry's is
    if not isinstance(obj.get("question"), str):
        raise ValueError("'question' must be a string")
    for name in QUERY_TEXT_FIELDS:
        if obj.get(name) is not None and not isinstance(obj[name], str):
            raise ValueError(f"'{name}' must be a string or null, got {obj[name]!r}")
    return obj


def read_queries(path: str | Path) -> list[dict[str, Any]]:
    """Read a queries JSONL file (one `parse_query` object a line): the format of ``kvgraft ask --queries``,
    ``bench``, ``calibrate`` and ``demo``. Errors name the file and the line; duplicate ids are refused."""
    path = Path(path)
    return _unique_ids(path, read_jsonl(path, parse_query, what="queries", items="queries"), lambda row: str(row["id"]))


# -- the in-process state cache -------------------------------------------------------------------------


class BaseStateCache(ByteLRU[SavedState]):
    """Verified states kept in memory under a byte budget, keyed by
    `kvgraft_plugin.engine.state_loader.StateLoader.key`:
    the `kvgraft_plugin.library.lru.ByteLRU` interface for `SavedState` values (after llama-cpp-python's cache)."""


class RamStateCache(RamLRU[SavedState], BaseStateCache):
    """LRU of verified states in RAM; a state larger than the whole budget is not kept. Thread-safe."""

    def __init__(self, capacity_bytes: int = 1 << 30) -> None:
        super().__init__(capacity_bytes, size=lambda state: state.nbytes)


# -- signing ----------------------------------------------------------------------------------------


def load_key(key_file: str | Path) -> bytes:
    """Read a raw HMAC key of at least 32 bytes."""
    try:
        key = Path(key_file).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read key file {key_file}: {exc}") from exc
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"key file {key_file} holds {len(key)} bytes; at least {MIN_KEY_BYTES} are needed")
    return key


def _hmac(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


# -- the library ----------------------------------------------------------------------------------------


@dataclass
class Library:
    """A library folder. Load with `Library.open`, create with `Library.create`."""

    path: Path
    model: dict[str, Any] = field(default_factory=dict)
    """The model it was built with: ``{"path", "sha256"}``."""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    embedder: dict[str, Any] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    answer_format: AnswerFormat = "answer"
    """How its entries are rendered (`kvgraft_plugin.library.template`): ``answer`` or ``solution``."""
    template: TemplateKind = "text"
    """``text`` or ``chat`` (the model's chat template)."""
    chat_template: str | None = None
    """With the ``chat`` template: a llama.cpp built-in template's name, or ``None`` for the model's own."""
    routing: dict[str, Any] = field(default_factory=dict)
    """``{"threshold", "margin", "source"}``: source is ``"geometry"`` (derived by build from the entries'
    embeddings), ``"calibrated"`` (``kvgraft calibrate``) or ``"user"`` (``build --threshold``)."""
    entries: dict[str, EntryRecord] = field(default_factory=dict)
    aliases: dict[str, Alias] = field(default_factory=dict)
    """Questions a judge approved as an entry's problem (`kvgraft_plugin.library.aliases`), by `alias_key`."""
    revoked: dict[str, str] = field(default_factory=dict)
    """Questions (by `alias_key`) a user revoked, with the entry they were revoked from: that entry never
    grafts for them again, and a judge's later approval of the pair is not stored, until `allow_aliases`."""
    trusted: bool = True
    """False when a key is configured and the signature is missing or wrong: nothing from it is used."""
    untrusted_reason: str = ""
    store: Store = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    """Where its files live (`kvgraft_plugin.library.store`): by default the folder ``path`` itself; for a library at
    a URL, the URL mirrored in ``path``."""

    def __post_init__(self) -> None:
        if self.store is None:
            self.store = FolderStore(self.path)

    @property
    def location(self) -> str:
        """Where the library lives: its URL, or its folder."""
        return self.store.location

    @classmethod
    def create(cls, path: str | Path) -> Library:
        """An empty library in the folder ``path`` (nothing is written until `save`); for a URL, use
        `open_or_create`."""
        return cls(Path(path))

    @classmethod
    def open_or_create(cls, path: str | Path, *, cache_dir: str | Path | None = None) -> Library:
        """The library at ``path`` (folder or URL), or an empty one there when it has no manifest yet."""
        store = open_store(path, cache_dir=cache_dir)
        if not store.pull():
            return cls(store.folder, store=store)
        library = cls._open_folder(store, None)
        library._warn_unrouted()
        return library

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        key: bytes | None = None,
        cache_dir: str | Path | None = None,
        cache_bytes: int = DEFAULT_REMOTE_CACHE_BYTES,
    ) -> Library:
        """Load ``path/manifest.json``; ``path`` may be a URL (mirrored under ``cache_dir``, its states kept
        within ``cache_bytes``). With ``key``, check ``manifest.sig`` first.

        A bad signature does not raise: the library is returned with ``trusted=False`` so that the
        engine can still decode plainly and report ``unsigned``.
        """
        store = open_store(path, cache_dir=cache_dir, cache_bytes=cache_bytes)
        if not store.pull():
            raise LibraryError(f"{store.location} is not a kvgraft library (no {MANIFEST}); run `kvgraft build`")
        library = cls._open_folder(store, key)
        library._warn_unrouted()
        return library

    def _warn_unrouted(self) -> None:
        """Warn, naming them, about entries the index lacks and index rows that name no entry: an id renamed
        in the manifest without a rebuild would otherwise drop out of routing silently."""
        if not self.trusted or not self.index:
            return
        indexed = set(self.index.get("ids", []))
        for ids, what in (
            (sorted(set(self.entries) - indexed), "not in its index, so not routed"),
            (sorted(indexed - set(self.entries)), "in its index but not among its entries (renamed or removed?)"),
        ):
            if ids:
                shown = ", ".join(repr(i) for i in ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
                logger.warning(
                    "library %s: %s %s %s; rebuild the index: kvgraft build SOURCE --library %s",
                    self.location,
                    "entries" if len(ids) > 1 else "entry",
                    shown,
                    ("are " if len(ids) > 1 else "is ") + what,
                    self.location,
                )

    @classmethod
    def _open_folder(cls, store: Store, key: bytes | None) -> Library:
        path = store.folder
        manifest_path = path / MANIFEST
        try:
            raw = manifest_path.read_bytes()
        except FileNotFoundError as exc:
            raise LibraryError(f"{path} is not a kvgraft library (no {MANIFEST}); run `kvgraft build`") from exc
        trusted, reason = True, ""
        if key is not None:
            sig_path = path / SIGNATURE
            if not sig_path.is_file():
                trusted, reason = False, "the library is not signed"
            elif not hmac.compare_digest(sig_path.read_bytes().strip(), _hmac(key, raw).encode()):
                trusted, reason = False, "the signature does not match the manifest"
        try:
            data = loads_json(raw.decode("utf-8"))
            if data.get("format") != MANIFEST_FORMAT:
                raise LibraryError(f"manifest format {data.get('format')!r}, expected {MANIFEST_FORMAT}")
            entries = {k: EntryRecord.from_json(v) for k, v in data["entries"].items()}
            for k, record in entries.items():  # a record under another entry's key would be served for it
                if k != record.id:
                    raise ValueError(f"entry {k!r} holds the record of entry {record.id!r}")
            library = cls(
                path,
                model=dict(data.get("model", {})),
                fingerprint=dict(data.get("fingerprint", {})),
                embedder=dict(data.get("embedder", {})),
                index=_index_record(data.get("index", {})),
                routing=_routing(data),
                answer_format=_answer_format(data.get("answer_format", "answer")),
                template=_template_kind(data.get("template", "text")),
                chat_template=_optional_text(data.get("chat_template"), "chat_template"),
                entries=entries,
                aliases=parse_aliases(data.get("aliases"), entries),
                revoked=parse_revoked(data.get("revoked")),
                trusted=trusted,
                untrusted_reason=reason,
                store=store,
            )
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            if not trusted:  # a tampered manifest under a key: refuse as unsigned, not as a crash
                return cls(path, trusted=False, untrusted_reason=reason, store=store)
            raise LibraryError(f"{manifest_path} is corrupt: {exc}") from exc
        if not trusted:
            logger.warning("library %s refused: %s", path, reason)
        return library

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON."""
        return {
            "format": MANIFEST_FORMAT,
            "model": self.model,
            "fingerprint": self.fingerprint,
            "embedder": self.embedder,
            "index": self.index,
            "routing": self.routing,
            "answer_format": self.answer_format,
            "template": self.template,
            **({"chat_template": self.chat_template} if self.chat_template is not None else {}),
            "entries": {k: self.entries[k].to_json() for k in sorted(self.entries)},
            **({"aliases": [self.aliases[k].to_json() for k in sorted(self.aliases)]} if self.aliases else {}),
            **({"revoked": [{"question": k, "entry_id": v} for k, v in sorted(self.revoked.items())]}
               if self.revoked else {}),
        }  # fmt: skip

    @property
    def threshold(self) -> float | None:
        """The routing threshold stored in the library, if any."""
        value = self.routing.get("threshold")
        return None if value is None else float(value)

    def save(self, *, key: bytes | None = None) -> bool:
        """Write the manifest atomically if it changed; return whether it did.

        A changed manifest no longer matches its signature: with ``key`` it is signed again, else the
        signature is removed (with a warning: the library must be signed again). An unchanged one is not
        rewritten, and keeps its signature.
        """
        data = (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode("utf-8")
        path = self.path / MANIFEST
        if path.is_file() and path.read_bytes() == data:
            return False
        atomic_write(path, data)
        signature = self.path / SIGNATURE
        signed = signature.is_file()
        if signed:
            signature.unlink()
        self.store.publish(MANIFEST)  # the manifest goes last: every file it names is published already
        if signed and key is not None:
            self.sign(key)
        elif signed:
            self.store.delete(SIGNATURE)
            logger.warning("%s changed: its signature was removed; sign it again (kvgraft sign)", self.location)
        return True

    def add_aliases(self, aliases: Sequence[Alias], *, key: bytes | None = None) -> bool:
        """Store ``aliases`` in the manifest: read afresh under the lock (what a build wrote meanwhile is kept),
        the aliases added, written and, if it was signed, signed again with ``key``. They are added to this
        object in any case; False when nothing could be written: a signed library and no ``key`` (an unsigned
        write would make it untrusted to every reader with the key), or a build holds the lock."""
        aliases = [a for a in aliases if self.revoked.get(a.key) != a.entry_id]
        if not aliases:
            return False
        for alias in aliases:
            self.aliases[alias.key] = alias
        if (self.path / SIGNATURE).is_file() and key is None:
            logger.warning("%s is signed and no key is configured: new aliases are kept in memory only", self.location)
            return False
        try:
            with self.lock():
                fresh = self._reread(key)
                fresh.aliases.update(
                    {
                        a.key: a
                        for a in aliases
                        if a.entry_id in fresh.entries and fresh.revoked.get(a.key) != a.entry_id
                    }
                )
                fresh.save(key=key)
        except LibraryError as exc:
            logger.warning("the new aliases of %s are kept in memory only: %s", self.location, exc)
            return False
        return True

    def revoke_aliases(self, keys: Sequence[str], *, key: bytes | None = None) -> list[Alias]:
        """Remove the aliases matched by ``keys`` (`alias_key` texts), remember each revocation (`revoked`)
        and save (signed again with ``key``); the removed ones."""
        removed = [self.aliases.pop(k) for k in keys if k in self.aliases]
        if removed:
            self.revoked.update({a.key: a.entry_id for a in removed})
            with self.lock():
                self.save(key=key)
        return removed

    def allow_aliases(self, keys: Sequence[str], *, key: bytes | None = None) -> list[str]:
        """Forget the revocations of ``keys`` (a user re-approves the pairs for a judge) and save; the keys
        that were revoked."""
        allowed = [k for k in keys if self.revoked.pop(k, None) is not None]
        if allowed:
            with self.lock():
                self.save(key=key)
        return allowed

    def read_aliases(self, key: bytes | None = None) -> tuple[dict[str, Alias], dict[str, str]] | None:
        """The aliases and revocations its folder's manifest holds now (another process may have changed them),
        or ``None`` when that manifest is not this library's any more (untrusted, unreadable, or other entries:
        a rebuild, which `kvgraft_plugin.routing.library_routing.LibraryRouting.reload` reads)."""
        try:
            fresh = self._open_folder(self.store, key)
        except (KVGraftError, OSError, RecursionError):
            return None
        if not fresh.trusted or fresh.entries.keys() != self.entries.keys():
            return None
        return fresh.aliases, fresh.revoked

    def _reread(self, key: bytes | None) -> Library:
        """This library as its store holds it now."""
        self.store.pull()
        fresh = self._open_folder(self.store, key)
        if not fresh.trusted:
            raise LibraryError(f"its manifest changed and is not trusted now: {fresh.untrusted_reason}")
        return fresh

    def publish(self, rel: str) -> None:
        """Make the file ``rel`` (a state or the index, just written) durable where the library lives: a
        no-op for a folder, an upload for a URL. Call it before the `save` that names the file."""
        self.store.publish(rel)

    def remove(self, rel: str) -> None:
        """Delete the file ``rel`` from the library (and its URL)."""
        self.store.delete(rel)

    def has_state(self, record: EntryRecord) -> bool:
        """Whether ``record``'s state file exists (in the folder, or at the URL); a symlink or a special file
        in its place does not count, so that a build replaces it."""
        return self.store.exists(record.state_file)

    def sign(self, key: bytes) -> Path:
        """Write ``manifest.sig``: HMAC-SHA256 of the manifest bytes (entries, hashes, index)."""
        sig_path = self.path / SIGNATURE
        atomic_write(sig_path, _hmac(key, (self.path / MANIFEST).read_bytes()) + "\n")
        self.store.publish(SIGNATURE)
        return sig_path

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive build lock; a second concurrent build is refused (for a URL: on this machine)."""
        from filelock import FileLock, Timeout  # portable: fcntl would not import on Windows

        self.path.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.path / ".lock")
        try:
            lock.acquire(timeout=0)
        except Timeout as exc:
            raise LibraryError(f"another build holds the lock on {self.path}") from exc
        try:
            yield
        finally:
            lock.release()

    def get(self, entry_id: str) -> EntryRecord:
        """The record of ``entry_id``; raises `EntryNotFoundError`."""
        try:
            return self.entries[entry_id]
        except KeyError:
            raise EntryNotFoundError(f"no entry {entry_id!r} in {self.location}") from None

    def read_state(self, record: EntryRecord, runtime_fingerprint: Mapping[str, Any]) -> SavedState:
        """Read ``record``'s state file and check it is the one the manifest names: its digest, then its
        header against the manifest and ``runtime_fingerprint``. A failure raises a `StateError` whose
        ``reason`` is the fallback code. Whether the state may serve a runtime, and its payload's
        structure, are `kvgraft_plugin.engine.state_loader.StateLoader`'s to check (before this read).
        """
        self.store.ensure(record.state_file)  # FileNotFoundError -> "missing"
        buf = read_file(self.path / record.state_file, root=self.path)  # FileNotFoundError -> "missing"
        try:
            state = decode_state(buf, expected_digest=record.state_digest)
        except IntegrityError:
            self.store.discard(record.state_file)  # a damaged download is fetched again next time
            raise
        check_fingerprint(state.fingerprint, runtime_fingerprint)
        if state.entry_id != record.id or state.tokens != record.tokens:
            raise IntegrityError(f"state file {record.state_file} does not belong to entry {record.id!r}")
        return state
