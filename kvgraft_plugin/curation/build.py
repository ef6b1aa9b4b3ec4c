"""``kvgraft build``: render each entry, prefill it, save its exact KV state, index it.

Builds are incremental and resumable. Each state file is written (and, for a URL, uploaded) before any
manifest names it. The manifest is rewritten (atomically) at most every `CHECKPOINT_SECONDS` while entries
are built, once at the end, and when a build is interrupted: a library of N entries costs a handful of
manifest writes, not N. An interrupted build leaves a consistent library holding the entries of its last
manifest (a killed one may leave states that no manifest names yet: they are rebuilt), and rerunning
resumes it.
Each state is verified bitwise when it is built: the entry's own problem is fed as a probe after the
original prefill and after a restore, and the two logit vectors must be equal. A state that fails is
kept but flagged ``inexact``, and the engine never grafts it.

An entry's ``tests`` are Python code from the source's author: they run (contained, see
`kvgraft_plugin.curation.sandbox.run_tests`) only when the build is asked to (``run_tests=True``, ``--run-tests``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgraft_plugin.core.config import check_threshold
from kvgraft_plugin.core.exceptions import ContextOverflowError, LibraryError, SourceError
from kvgraft_plugin.core.models import CATALOGUE, model_name_of
from kvgraft_plugin.core.statefile import atomic_write, encode_state
from kvgraft_plugin.curation.answer_checks import entry_problems
from kvgraft_plugin.engine.engine import GraftEngine
from kvgraft_plugin.library.index import IndexKind, VectorIndex, geometry_threshold, stale_index_files
from kvgraft_plugin.library.library import EntryRecord, Library, fingerprint_sha256, source_sha256, state_file_name
from kvgraft_plugin.library.template import Entry

__all__ = ["BuildReport", "EntryBuilder", "build_library", "capture_entry", "encode_entry"]

logger = logging.getLogger(__name__)

#: While entries are built, the manifest is saved at most this often (seconds): what a killed build can lose.
CHECKPOINT_SECONDS = 30.0

#: Builds the given (entry, source sha256) pairs and yields each one's record and state file bytes, in
#: any order, as each finishes: in this process by default, on Ray workers with ``kvgraft build --ray``.
EntryBuilder = Callable[[list[tuple[Entry, str]]], Iterable[tuple[EntryRecord, bytes]]]


@dataclass
class BuildReport:
    """What a build did."""

    built: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    invalid: dict[str, list[str]] = field(default_factory=dict)
    inexact: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    """Entries with nothing to check their solution against (no ``answer``, no ``tests``): built, unverified."""
    tests_run: bool = False
    """Whether the entries' ``tests`` were run (``run_tests=True``)."""
    tested: list[str] = field(default_factory=list)
    """Entries whose tests ran (pass or fail)."""
    untested: list[str] = field(default_factory=list)
    """Entries with tests that were not run (``run_tests=False``): their solutions were not checked by them."""


def capture_entry(engine: GraftEngine, entry: Entry) -> tuple[list[int], bytearray, float]:
    """Prefill ``entry``'s prefix, capture its state and check a restore bitwise.

    Returns (prefix tokens, sequence-framed state, max |logit diff| of the probe: 0.0 when exact).
    The probe is the entry's own problem as a query, the likeliest question it will serve.
    """
    tokens = engine.prefix_tokens(entry)
    probe = engine.probe_tokens(entry)
    if len(tokens) + len(probe) + 1 > engine.n_ctx:
        raise ContextOverflowError(
            f"entry {entry.id} needs {len(tokens) + len(probe) + 1} tokens; n_ctx is {engine.n_ctx}"
        )
    captured = engine.capture(tokens, probe=probe)
    assert captured.max_diff is not None
    return tokens, captured.payload, captured.max_diff


def build_library(
    library_dir: str | Path,
    source: list[Entry],
    *,
    engine: GraftEngine,
    rebuild: bool = False,
    prune: bool = False,
    skip_invalid: bool = False,
    index_kind: IndexKind | None = None,
    threshold: float | None = None,
    progress: Callable[[int], Any] | None = None,
    cache_dir: str | Path | None = None,
    builder: EntryBuilder | None = None,
    run_tests: bool = False,
) -> BuildReport:
    """Build or update the library at ``library_dir`` (a folder or an fsspec URL, mirrored under
    ``cache_dir``) from ``source`` with ``engine``'s model.

    ``engine`` must have been created without a library (or on this one) and with the configuration
    the library is to be served with: that configuration becomes the states' fingerprint. Each entry's
    state is durable (uploaded, for a URL) before the manifest that names it is written. ``builder``
    builds the entries elsewhere (`EntryBuilder`; its states must carry ``engine``'s fingerprint); this
    process still writes every file, one entry at a time as results arrive, and the manifest (see the
    module's docstring for when).

    ``run_tests`` runs each entry's ``tests`` (Python code from the source, run contained) to verify it; off by
    default, since the source may not be yours. The report says which entries were tested or left untested.
    """
    check_threshold(threshold)
    report = BuildReport(tests_run=run_tests)
    for entry in source:
        problems = entry_problems(entry, with_tests=run_tests) + _fit_problems(engine, entry)
        if entry.tests is not None:
            (report.tested if run_tests else report.untested).append(entry.id)
        if problems:
            report.invalid[entry.id] = problems
    if report.invalid and not skip_invalid:
        lines = [f"  {k}: {'; '.join(v)}" for k, v in report.invalid.items()]
        raise SourceError(f"{len(report.invalid)} entries failed verification:\n" + "\n".join(lines))
    report.unverified = [e.id for e in source if e.answer is None and e.tests is None and e.id not in report.invalid]
    if report.unverified:
        logger.warning(
            "%d entries have neither an answer nor tests to verify their solution: %s",
            len(report.unverified),
            ", ".join(report.unverified[:5]) + (" ..." if len(report.unverified) > 5 else ""),
        )
    if report.untested:
        logger.warning(
            "%d entries' tests were not run (run_tests=False; a source's tests are code): %s",
            len(report.untested),
            ", ".join(report.untested[:5]) + (" ..." if len(report.untested) > 5 else ""),
        )
    for entry_id, problems in report.invalid.items():
        logger.warning("skipping invalid entry %s: %s", entry_id, "; ".join(problems))
    wanted = [e for e in source if e.id not in report.invalid]

    library = Library.open_or_create(library_dir, cache_dir=cache_dir)
    path = library.path
    with library.lock():
        fingerprint = engine.fingerprint
        fp_sha = fingerprint_sha256(fingerprint)
        if library.fingerprint and library.fingerprint != fingerprint and library.entries:
            logger.warning("configuration or model changed: every entry of %s is rebuilt", library.location)
        library.fingerprint = fingerprint
        library.answer_format = engine.answer_format
        library.template = engine.template.kind
        library.chat_template = getattr(engine.template, "chat_name", None)
        library.model = _model_record(engine)
        (path / "states").mkdir(parents=True, exist_ok=True)
        for stale in [*path.glob(".*.tmp"), *(path / "states").glob(".*.tmp")]:
            stale.unlink(missing_ok=True)  # left by a build killed mid-write; never part of the library

        if prune:
            keep = {e.id for e in wanted}
            gone = [library.entries.pop(entry_id) for entry_id in sorted(set(library.entries) - keep)]
            if gone:
                library.save()  # no manifest may name a state once it is deleted
            for record in gone:
                library.remove(record.state_file)
                report.removed.append(record.id)

        pending: list[tuple[Entry, str]] = []
        for entry in wanted:
            old = library.entries.get(entry.id)
            src_sha = source_sha256(entry)
            if (
                not rebuild
                and old is not None
                and old.source_sha256 == src_sha
                and old.fingerprint_sha256 == fp_sha
                and library.has_state(old)
            ):
                report.skipped.append(entry.id)
                if progress is not None:
                    progress(1)
            else:
                if old is not None and old.source_sha256 != src_sha:
                    logger.warning("entry %s changed: rebuilding it", entry.id)
                pending.append((entry, src_sha))

        build = builder or (lambda items: (encode_entry(engine, entry, sha) for entry, sha in items))
        saved = time.monotonic()
        try:
            for record, data in build(pending):
                if record.fingerprint_sha256 != fp_sha:
                    raise LibraryError(f"entry {record.id} was built under another configuration than this build's")
                atomic_write(path / record.state_file, data)
                library.publish(record.state_file)  # durable before any manifest names it
                old = library.entries.get(record.id)
                library.entries[record.id] = record
                report.built.append(record.id)
                if time.monotonic() - saved >= CHECKPOINT_SECONDS or _would_be_skipped(old, record):
                    library.save()
                    saved = time.monotonic()
                if record.fidelity != "exact":
                    report.inexact.append(record.id)
                    logger.warning(
                        "entry %s is not bitwise exact (max diff %g): it will not be grafted",
                        record.id,
                        record.fidelity_max_diff,
                    )
                if progress is not None:
                    progress(1)
        except BaseException:  # interrupted (Ctrl-C, a failed entry): keep what is finished, then go on raising
            _save_finished(library)
            raise
        library.save()  # every built entry is listed before the index is rebuilt

        previous_index = library.index.get("file")
        index = _update_index(library, engine, index_kind, rebuild_all=rebuild or bool(report.removed))
        library.publish(library.index["file"])
        if threshold is not None:
            library.routing = {"threshold": threshold, "margin": 0.0, "source": "user"}
        elif library.routing.get("source") not in ("calibrated", "user"):
            library.routing = {"threshold": geometry_threshold(index), "margin": 0.0, "source": "geometry"}
            logger.info("routing threshold %.3f derived from the entries' embeddings", library.threshold)
        library.save()
        for stale in stale_index_files(path, {library.index["file"], str(previous_index)}):
            library.remove(stale.name)
    return report


def _would_be_skipped(old: EntryRecord | None, new: EntryRecord) -> bool:
    """Whether the saved manifest's ``old`` record names the file just replaced by ``new``'s other bytes and
    would still pass for built on a rerun (same source, same configuration): then it is saved at once, so
    that a killed build cannot leave it naming a file it does not match."""
    return (
        old is not None
        and old.state_digest != new.state_digest
        and (old.source_sha256, old.fingerprint_sha256) == (new.source_sha256, new.fingerprint_sha256)
    )


def _save_finished(library: Library) -> None:
    """Save the manifest of an interrupted build; a failure to do so is logged, not raised over the cause."""
    try:
        library.save()
    except Exception as exc:  # the storage may be what failed: the interruption's own error goes on
        logger.warning("could not save the finished entries of %s: %s", library.location, exc)


def _fit_problems(engine: GraftEngine, entry: Entry) -> list[str]:
    """Why an entry cannot be built under ``engine``'s n_ctx (checked before anything is written)."""
    needed = len(engine.prefix_tokens(entry)) + len(engine.probe_tokens(entry))
    if needed + 1 > engine.n_ctx:
        return [f"needs {needed + 1} tokens with its probe; n_ctx is {engine.n_ctx}"]
    return []


def encode_entry(engine: GraftEngine, entry: Entry, src_sha: str) -> tuple[EntryRecord, bytes]:
    """Capture ``entry``'s state with ``engine`` (checked bitwise) and encode its state file: the record
    and the file's bytes, written nowhere yet."""
    tokens, payload, max_diff = capture_entry(engine, entry)
    data = encode_state(entry.id, tokens, engine.fingerprint, payload)
    record = EntryRecord(
        entry=entry,
        tokens=tuple(tokens),
        state_file=state_file_name(entry.id),
        state_sha256=hashlib.sha256(data).hexdigest(),
        state_digest=bytes(data[-32:]).hex(),
        state_bytes=len(data),
        fingerprint_sha256=fingerprint_sha256(engine.fingerprint),
        source_sha256=src_sha,
        fidelity="exact" if max_diff == 0.0 else "inexact",
        fidelity_max_diff=max_diff,
    )
    return record, bytes(data)


def _model_record(engine: GraftEngine) -> dict[str, Any]:
    model_path = engine.model_path.resolve()
    name = model_name_of(model_path)
    bundled = name if name is not None and CATALOGUE[name].bundled else None
    return {"path": str(model_path), "sha256": engine.model_sha256, "bundled": bundled, "name": name}


def _update_index(library: Library, engine: GraftEngine, kind: IndexKind | None, *, rebuild_all: bool) -> VectorIndex:
    """Add missing entries to the index; rebuild it when entries left or changed, or the embedder did."""
    embedder = engine.routing.embedder
    kind = kind or library.index.get("kind") or "flat"
    index: VectorIndex | None = None
    stale = (
        rebuild_all
        or library.embedder != embedder.identity
        or library.index.get("kind") != kind
        or library.index.get("problems") is None
    )
    if not stale:
        try:
            index = VectorIndex.load(library.path, library.index, embedder.dim)
        except LibraryError as exc:
            logger.warning("rebuilding the index: %s", exc)
    indexed_problems: dict[str, str] = {} if index is None else dict(library.index.get("problems", {}))
    if index is not None and any(
        library.entries.get(i) is None or library.entries[i].entry.problem != indexed_problems.get(i) for i in index.ids
    ):
        index = None  # an entry left or its problem text changed: rows cannot be edited in place
    if index is None:
        index, indexed_problems = VectorIndex(embedder.dim, kind), {}
    missing = [i for i in sorted(library.entries) if i not in indexed_problems]
    if missing:
        vectors = engine.embed([library.entries[i].entry.problem for i in missing])
        index.add(missing, vectors)
        indexed_problems.update({i: library.entries[i].entry.problem for i in missing})
    record = index.save(library.path)
    record["problems"] = indexed_problems
    library.index = record
    library.embedder = embedder.identity
    return index
