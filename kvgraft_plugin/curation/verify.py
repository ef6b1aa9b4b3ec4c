"""``kvgraft verify``: integrity, compatibility and (optionally) bitwise fidelity of every entry."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvgraft_plugin.core.exceptions import IndexMismatchError, KVGraftError, LibraryError, StateError
from kvgraft_plugin.core.statefile import atomic_write, read_file
from kvgraft_plugin.engine.engine import GraftEngine
from kvgraft_plugin.library.library import source_sha256
from kvgraft_plugin.library.template import Entry

__all__ = ["VerifyRow", "verify_library"]


@dataclass
class VerifyRow:
    """One entry's verdict. ``reason`` uses the fallback codes (integrity, incompatible, ...)."""

    id: str
    ok: bool
    reason: str | None = None
    repaired: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def verify_library(engine: GraftEngine, *, fidelity: bool = False, repair: bool = False) -> list[VerifyRow]:
    """Check every entry of ``engine.library``; with ``repair``, rebuild the ones that fail."""
    from kvgraft_plugin.curation.build import encode_entry

    library = engine.library
    if library is None:
        raise KVGraftError("verify needs a library")
    if not library.trusted:
        return [VerifyRow("*", False, f"unsigned: {library.untrusted_reason}")]
    rows = []
    for record in library.entries.values():
        row = VerifyRow(record.id, True)
        if source_sha256(record.entry) != record.source_sha256:
            # edited text is never served nor rebuilt from: only the source can restore it
            rows.append(
                VerifyRow(
                    record.id,
                    False,
                    "integrity: the entry's text changed after it was built; rebuild it from its source",
                )
            )
            continue
        try:
            path = library.path / record.state_file
            if path.is_file() and hashlib.sha256(read_file(path)).hexdigest() != record.state_sha256:
                raise StateError("state file does not match its sha256 in the manifest")
            state = engine.load_state(record, cached=False)
            if fidelity:
                diff = _fidelity(engine, list(record.tokens), state.payload, record.entry)
                if diff is not None:
                    row.ok, row.reason = False, f"inexact: restore + probe differs from prefill + probe ({diff})"
        except FileNotFoundError:
            row.ok, row.reason = False, "missing: state file not found"
        except StateError as exc:
            row.ok, row.reason = False, f"{exc.reason}: {exc}"
        if not row.ok and repair:
            rebuilt, data = encode_entry(engine, record.entry, record.source_sha256)
            atomic_write(library.path / rebuilt.state_file, data)
            library.publish(rebuilt.state_file)
            library.entries[record.id] = rebuilt
            library.fingerprint = engine.fingerprint
            library.save()
            engine.forget_state(record)
            row.repaired = True
        rows.append(row)
    rows.append(_verify_index(engine, repair=repair))
    return rows


def _verify_index(engine: GraftEngine, *, repair: bool) -> VerifyRow:
    """The index lists exactly the manifest's entries, and each row is the embedding of its entry's problem
    (two swapped ids would graft the wrong entry)."""
    from kvgraft_plugin.curation.build import _update_index

    library = engine.library
    assert library is not None
    reason = None
    try:
        index = engine.routing.index
        if index is None or set(index.ids) != set(library.entries):
            raise LibraryError("the index does not list exactly the manifest's entries")
        expected = engine.embed([library.entries[i].entry.problem for i in index.ids])
        worst = float(np.min(np.sum(expected * index.vectors(), axis=1)))
        if worst < 0.999:
            raise IndexMismatchError(f"an index row is not its entry's problem (cosine {worst:.3f})")
    except LibraryError as exc:
        reason = f"index: {exc}"
    if reason is None:
        return VerifyRow("(index)", True)
    if not repair:
        return VerifyRow("(index)", False, reason)
    _update_index(library, engine, None, rebuild_all=True)
    library.publish(library.index["file"])  # a URL library uploads the rebuilt index before its manifest
    library.save()
    engine.routing.reload()
    return VerifyRow("(index)", False, reason, repaired=True)


def _fidelity(engine: GraftEngine, tokens: list[int], payload: Any, entry: Entry) -> str | None:
    diff = engine.restore_diff(tokens, payload, engine.probe_tokens(entry))
    return None if diff == 0.0 else f"max |diff| {diff:.4g}"
