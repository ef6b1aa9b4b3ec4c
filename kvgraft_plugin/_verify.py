"""``kvgraft verify``: integrity, compatibility and (optionally) bitwise fidelity of every entry."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

from ._engine import GraftEngine
from ._exceptions import KVGraftError, StateError
from ._library import fingerprint_sha256
from ._state import read_file
from ._template import render_query

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
    from ._build import _build_entry

    library = engine.library
    if library is None:
        raise KVGraftError("verify needs a library")
    if not library.trusted:
        return [VerifyRow("*", False, f"unsigned: {library.untrusted_reason}")]
    rows = []
    for record in library.entries.values():
        row = VerifyRow(record.id, True)
        try:
            path = library.path / record.state_file
            if path.is_file() and hashlib.sha256(read_file(path)).hexdigest() != record.state_sha256:
                raise StateError("state file does not match its sha256 in the manifest")
            state = library.load_state(
                record,
                engine.fingerprint,
                None,
                lambda state: engine._validate_payload(state, record),  # noqa: B023
            )
            if fidelity:
                diff = _fidelity(engine, list(record.tokens), state.payload, record.entry.problem)
                if diff is not None:
                    row.ok, row.reason = False, f"inexact: restore + probe differs from prefill + probe ({diff})"
        except FileNotFoundError:
            row.ok, row.reason = False, "missing: state file not found"
        except StateError as exc:
            row.ok, row.reason = False, f"{exc.reason}: {exc}"
        if not row.ok and repair:
            library.entries[record.id] = _build_entry(
                engine, library.path, record.entry, record.source_sha256, fingerprint_sha256(engine.fingerprint)
            )
            library.fingerprint = engine.fingerprint
            library.save()
            engine.state_cache.discard(f"{library.path.resolve()}::{record.id}::{record.state_digest}")
            row.repaired = True
        rows.append(row)
    return rows


def _fidelity(engine: GraftEngine, tokens: list[int], payload: Any, problem: str) -> str | None:
    from ._build import restore_diff

    probe = engine.backend.tokenize(render_query(problem), add_bos=False)
    diff = restore_diff(engine.backend, tokens, payload, probe)
    return None if diff == 0.0 else f"max |diff| {diff:.4g}"
