"""``kvgraft doctor``: will grafting be exact for this model on this machine?

Probe prefixes of random tokens are cut where grafts go wrong: below the sliding window, past it and past
``n_ubatch``, and with a remainder chunk of one token. Each is prefilled, captured, restored and continued
with a probe query; the logits must be bitwise equal to the fresh prefill's. The saved bytes are then
restored under other thread counts and a larger context (the settings the fingerprint leaves out), where
restore + probe must again equal a fresh prefill + probe, and the bytes written there must equal the
original's; by default only for the prefix that has ever differed there (`CROSS_CHECKED`), so that a 1.5B
model's doctor takes minutes, not ten. A row's ``served`` says whether a library would use that setting;
any served row that is not exact fails the doctor. A row says how many tokens lookup decoding may verify
in one batch (`kvgraft_plugin.engine.batch_invariance`): it caps itself there, so that row is exact, and its note names
the first batch size that differed. The last says the same of sequences decoded together (batched serving).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvgraft_plugin.core.exceptions import KVGraftError
from kvgraft_plugin.engine.engine import GraftEngine
from kvgraft_plugin.tools.tiny_models import TINY_ARCHS, write_tiny_model

__all__ = ["ArchRow", "DoctorRow", "run_arch_matrix", "run_doctor"]

PROBE_TOKENS = 24


@dataclass
class DoctorRow:
    """One check: whether it was exact, whether a library serves that setting, and the worst logit gap."""

    check: str
    exact: bool
    served: bool
    max_abs_diff: float
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON form (``--json``)."""
        return asdict(self)


def _lengths(engine: GraftEngine) -> dict[str, int]:
    n_batch, n_ubatch, window = engine.config.llama.n_batch, engine.config.llama.n_ubatch, engine.n_swa
    room = engine.n_ctx - PROBE_TOKENS - 1
    lengths = {"one-token tail chunk": n_batch + 1, "past n_ubatch": n_ubatch + n_ubatch // 2 + 3}
    if window:
        lengths["below the window"] = max(2, window // 2)
        lengths["past the window"] = 4 * window - 51  # where a window-sized SWA cache has wrapped
    return {name: n for name, n in lengths.items() if n <= room}


#: The prefix restored under the other settings unless ``full``: the only one that has ever differed there
#: (a one-token prefill chunk took llama.cpp's vector path, whose bits depend on the thread count; the
#: chunking rule now cuts ``512 + 1`` as ``511 + 2``). Every prefix under every setting: ``full=True``.
CROSS_CHECKED = ("one-token tail chunk",)


def _tokens(engine: GraftEngine, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(100, min(engine.n_vocab, 30000), size=n)]


def _row(check: str, diff: float, served: bool, note: str = "") -> DoctorRow:
    return DoctorRow(check, diff == 0.0, served, diff, note)


def run_doctor(
    engine: GraftEngine,
    *,
    threads: tuple[int, ...] = (1, 4),
    larger_ctx: bool = True,
    full: bool = False,
    max_batch: int = 4,
    progress: Callable[[DoctorRow], None] | None = None,
) -> list[DoctorRow]:
    """Run every check with ``engine``'s model and settings (see the module docstring); ``progress`` is called
    with each row as it is done. The other settings restore the `CROSS_CHECKED` prefix, or every prefix
    with ``full``. With ``max_batch`` > 1 a last row says how many sequences decode together bitwise as
    each alone (what ``kvgraft serve --max-batch`` may batch)."""
    rows: list[DoctorRow] = []

    def done(row: DoctorRow) -> None:
        rows.append(row)
        if progress is not None:
            progress(row)

    probe = _tokens(engine, PROBE_TOKENS, seed=0)
    captured: dict[str, tuple[list[int], bytes]] = {}
    for i, (name, n) in enumerate(_lengths(engine).items(), start=1):
        tokens = _tokens(engine, n, seed=i)
        capture = engine.capture(tokens, probe=probe)
        if full or name in CROSS_CHECKED:
            captured[name] = (tokens, bytes(capture.payload))
        diff = capture.max_diff
        assert diff is not None
        done(_row(f"restore {name} ({n} tokens)", diff, True, _settings(engine)))
    others: list[tuple[str, dict[str, Any]]] = [(f"n_threads={t}", {"n_threads": t}) for t in threads]
    if larger_ctx:
        others.append((f"n_ctx={2 * engine.n_ctx}", {"n_ctx": 2 * engine.n_ctx}))
    for label, change in others:
        # decode="step": these engines only prefill and restore; measuring lookup's batches there cost a minute
        config = engine.config.replace(llama=engine.config.llama.replace(**change), decode="step")
        with GraftEngine(None, config=config) as other:
            for name, (tokens, saved) in captured.items():
                # one prefill: its bytes must equal the original's, and the original's restored must continue
                # the probe as that fresh prefill does
                check = other.capture(tokens, probe=probe, restore=saved)
                same_bytes = bytes(check.payload) == saved
                diff = check.max_diff
                assert diff is not None
                note = "" if same_bytes else "the prefill wrote other KV bytes than the original"
                done(DoctorRow(f"{label}: restore {name}", diff == 0.0 and same_bytes, True, diff, note))
    done(_lookup_row(engine))
    if max_batch > 1:
        config = engine.config.replace(max_batch=max_batch, decode="step")
        with GraftEngine(None, config=config) as batched:
            done(_batch_row(batched, max_batch))
    return rows


def _lookup_row(engine: GraftEngine) -> DoctorRow:
    report = engine.lookup.measure()
    differing = [row for row in report.rows if not row.bitwise]
    note = f"lookup decoding verifies up to {report.max_batch} tokens at once"
    if differing:
        first = differing[0]
        note += f"; a batch of {first.k} differs from steps by up to {first.max_diff:.3g} (KL {first.kl:.2g})"
    if not report.rows:
        note = "lookup decoding is not used for this model (its memory cannot drop rejected tokens)"
    return DoctorRow(
        f"lookup: batches of up to {report.max_batch} tokens equal one-token steps", True,
        engine.config.decode != "step", 0.0, note,
    )  # fmt: skip


def _batch_row(engine: GraftEngine, n_seq: int) -> DoctorRow:
    report = engine.sequences.measure()
    note = f"batched serving decodes up to {report.max_batch} requests together"
    if report.max_batch < 2:
        note = "batched serving is off here: requests are served one at a time"
    differing = [row for row in report.rows if not row.bitwise]
    if differing:
        first = differing[0]
        note += (
            f"; {first.k} sequences together differ from each alone by up to {first.max_diff:.3g} (KL {first.kl:.2g})"
        )
    return DoctorRow(
        f"batched: {report.max_batch} of {n_seq} sequences together equal each alone", True, True, 0.0, note
    )


@dataclass
class ArchRow:
    """One architecture of the matrix: its kind of cache, and whether every doctor check was exact."""

    arch: str
    layers: int
    swa: bool
    recurrent: bool
    hybrid: bool
    mrope: bool
    moe: bool
    exact: bool
    max_abs_diff: float
    state_bytes_per_token: float
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON form (``--json``)."""
        return asdict(self)


#: The matrix's context: small, so that every probe runs past the window and ``n_ubatch`` in a few ms.
MATRIX_SETTINGS = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_threads": 2}


def run_arch_matrix(folder: str | Path | None = None, *, threads: tuple[int, ...] = (1, 4)) -> list[ArchRow]:
    """The doctor's checks on a tiny random-weight model of each architecture in `TINY_ARCHS`, written
    into ``folder`` (a temporary one by default), plus a byte round trip: a restored state, captured
    again, must be the bytes that were restored."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(folder or scratch)
        return [_arch_row(name, write_tiny_model(root / f"{name}.gguf", name), threads) for name in TINY_ARCHS]


def _arch_row(name: str, path: Path, threads: tuple[int, ...]) -> ArchRow:
    spec = TINY_ARCHS[name]
    nan = float("nan")
    row = ArchRow(name, spec.n_layer, spec.swa, spec.recurrent, spec.hybrid, spec.mrope, spec.moe, False, nan, nan)
    try:
        with GraftEngine(None, model_path=str(path), **MATRIX_SETTINGS) as engine:  # type: ignore[arg-type]
            checks = run_doctor(engine, threads=threads)
            tokens = _tokens(engine, max(_lengths(engine).values()), seed=99)
            payload = engine.capture(tokens).payload
            again = engine.run_exclusive(lambda backend: _recapture(backend, payload, len(tokens)))
    except KVGraftError as exc:
        row.note = str(exc)
        return row
    failed = [c.check for c in checks if not c.exact]
    if bytes(again) != bytes(payload):
        failed.append("restore + capture gave other bytes")
    row.exact = not failed
    row.max_abs_diff = max(c.max_abs_diff for c in checks)
    row.state_bytes_per_token = round(len(payload) / len(tokens), 1)
    row.note = "; ".join(failed)
    return row


def _recapture(backend: Any, payload: bytearray, n_tokens: int) -> bytearray:
    backend.restore_state(payload, n_tokens)
    again: bytearray = backend.capture_state()
    backend.reset()
    return again


def _settings(engine: GraftEngine) -> str:
    llama = engine.config.llama
    return f"swa_full={llama.swa_full} flash_attn={llama.flash_attn} n_threads={llama.n_threads}"
