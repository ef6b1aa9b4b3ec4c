"""Is a batch of k tokens bitwise equal to k one-token steps, on this build, model and settings?

Lookup decoding feeds drafted tokens in one batch and keeps the tokens the sampler picks from their logits;
it gives step decoding's text exactly only if those logits are bitwise the logits of one-token steps. That
depends on the llama.cpp build (llamafile's tinyBLAS batches differently), the model's weight types and the
context settings, so it is measured, never assumed: `measure` feeds a continuation one token at a time,
then drops it (as a rejected draft is dropped) and feeds its first k tokens as one batch, for k = 2 to 16
at two positions (batches crossing position 256 among them), and compares every position's logits with
``np.array_equal``. The largest k for
which every batch up to it was bitwise equal is what lookup decoding may use. Results are kept per
fingerprint in ``$XDG_CACHE_HOME/kvgraft/invariance/`` (``~/.cache/...``; `recall`, `remember`);
``kvgraft doctor --invariance`` measures again and prints them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from kvgraft_plugin.core.backend import Backend, BatchBackend
from kvgraft_plugin.core.paths import cache_root
from kvgraft_plugin.library.library import loads_json

__all__ = [
    "InvarianceReport",
    "InvarianceRow",
    "LookupBatch",
    "MAX_BATCH",
    "SequenceBatch",
    "measure",
    "measure_sequences",
    "recall",
    "remember",
]

logger = logging.getLogger(__name__)

#: The largest batch measured (and so the longest verified draft, plus the token before it).
MAX_BATCH = 16
#: Context lengths the measured batches start at: early in a context, and a batch crossing position 256.
_STARTS = (48, 250)
_TEXT = (
    "Solved problems with verified answers.\n\nProblem: Write a function that returns the sum of the squares "
    "of the even numbers in a list.\nSolution:\ndef sum_even_squares(xs):\n    return sum(x * x for x in xs "
    "if x % 2 == 0)\n\nProblem: What is 17 times 23?\nAnswer: 391\n\n"
)


@dataclass(frozen=True)
class InvarianceRow:
    """One batch size at one start position: the batch's logits against one-token steps."""

    k: int
    start: int
    bitwise: bool
    max_diff: float
    """Max |logit difference| over the batch's positions (0.0 when bitwise)."""
    kl: float
    """Max KL(step || batch) of the softmax over the positions, in nats."""
    argmax_same: bool


@dataclass(frozen=True)
class InvarianceReport:
    """One measurement: a row per batch shape, and the largest batch proven bitwise."""

    rows: tuple[InvarianceRow, ...]
    max_batch: int
    """The largest k with every batch of 2..k bitwise equal (1: lookup decoding cannot be exact)."""

    def to_json(self) -> dict[str, Any]:
        """JSON form, as cached and as ``kvgraft doctor --json`` prints it."""
        return {"max_batch": self.max_batch, "rows": [asdict(row) for row in self.rows]}


def measure(backend: Backend, *, max_batch: int = MAX_BATCH) -> InvarianceReport:
    """Measure batch invariance for batches of 2 to ``max_batch`` tokens; the report's rows end at the first
    k that differs. Clears the cache.

    A recurrent model is not measured (its memory cannot drop rejected draft tokens): ``max_batch`` 1."""
    if backend.layout.recurrent:
        return InvarianceReport((), 1)
    max_batch = min(max_batch, backend.n_batch, backend.n_ctx // 2)
    starts = sorted({max(2, min(start, backend.n_ctx - max_batch - 1)) for start in _STARTS})
    text = backend.tokenize(_TEXT, add_bos=False)
    tokens = (text * (starts[-1] // len(text) + 2))[: starts[-1] + max_batch]
    rows: list[InvarianceRow] = []
    proven = 1
    for start in starts:
        backend.reset()
        backend.prefill(tokens[:start])
        steps = []
        for token in tokens[start : start + max_batch]:
            backend.decode(token)
            steps.append(backend.logits(-1))
        for k in range(2, max_batch + 1):  # the batch replaces the steps' positions, as a lookup batch does
            backend.truncate(start)
            backend.verify(tokens[start : start + k])
            rows.append(_compare(k, start, steps[:k], [backend.logits(i) for i in range(k)]))
    for k in range(2, max_batch + 1):
        if not all(row.bitwise for row in rows if row.k == k):
            break
        proven = k
    backend.reset()
    rows.sort(key=lambda row: (row.k, row.start))
    return InvarianceReport(tuple(row for row in rows if row.k <= proven + 1), proven)


#: Decode steps compared per sequence when sequences are measured together, and their prompts' lengths.
_SEQ_STEPS = 4
_SEQ_PROMPT, _SEQ_PROMPT_STEP = 12, 9


def measure_sequences(backend: Backend) -> InvarianceReport:
    """Measure whether decoding n sequences together is bitwise equal to decoding each alone, for n = 2 to
    ``backend.n_seq``; the report's rows end at the first n that differs. Clears every sequence.

    Sequence k gets a prompt of its own length (``12 + 9k`` tokens); alone, it is prefilled and stepped
    through a continuation in a context with no other cells. Together, the first n are prefilled one after
    another, each alone (as the scheduler admits them), then fed one token each per batch; every step's
    logits are compared with ``np.array_equal``. A row's ``k`` is n, its ``start`` the longest prompt."""
    n_seq = getattr(backend, "n_seq", 1)
    if n_seq < 2:
        return InvarianceReport((), 1)
    backend = cast(BatchBackend, backend)
    text = backend.tokenize(_TEXT, add_bos=False)
    lengths = [_SEQ_PROMPT + _SEQ_PROMPT_STEP * k for k in range(n_seq)]
    end = n_seq + lengths[-1] + _SEQ_STEPS
    tokens = (text * (end // len(text) + 2))[:end]
    prompts = [tokens[k : k + n] for k, n in enumerate(lengths)]
    conts = [tokens[k + n : k + n + _SEQ_STEPS] for k, n in enumerate(lengths)]
    alone: list[list[np.ndarray]] = []
    for k in range(n_seq):
        backend.use_sequence(k)
        backend.reset()
        steps = [backend.prefill(prompts[k])]
        for token in conts[k][:-1]:
            backend.decode(token)
            steps.append(backend.logits(-1))
        alone.append(steps)
        backend.reset()
    rows: list[InvarianceRow] = []
    proven = 1
    for n in range(2, n_seq + 1):
        together: list[list[np.ndarray]] = []
        for k in range(n):
            backend.use_sequence(k)
            backend.reset()
            together.append([backend.prefill(prompts[k])])
        for step in range(_SEQ_STEPS - 1):
            backend.decode_batch([(k, conts[k][step]) for k in range(n)])
            for k in range(n):
                together[k].append(backend.logits(k))
        row = _compare(
            n, lengths[n - 1], [s for k in range(n) for s in alone[k]], [s for k in range(n) for s in together[k]]
        )
        rows.append(row)
        for k in range(n):
            backend.use_sequence(k)
            backend.reset()
        if not row.bitwise:
            break
        proven = n
    backend.use_sequence(0)
    return InvarianceReport(tuple(rows), proven)


def _compare(k: int, start: int, steps: list[np.ndarray], batch: list[np.ndarray]) -> InvarianceRow:
    bitwise = all(np.array_equal(a, b) for a, b in zip(steps, batch, strict=True))
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(steps, batch, strict=True))
    kl = max(_kl(a, b) for a, b in zip(steps, batch, strict=True))
    same = all(int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(steps, batch, strict=True))
    return InvarianceRow(k, start, bitwise, diff, kl, same)


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p = _log_softmax(p_logits.astype(np.float64))
    q = _log_softmax(q_logits.astype(np.float64))
    return float(np.sum(np.exp(p) * (p - q)))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())  # type: ignore[no-any-return]


def cache_path(key: dict[str, Any]) -> Path:
    """Where the report for ``key`` (a fingerprint plus the thread count) is kept."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / "invariance" / f"{digest}.json"


def recall(key: dict[str, Any]) -> int | None:
    """The largest batch measured for ``key`` before; ``None`` (measure again): never measured, or the file is
    unreadable or not a result `measure` gives for ``key`` (`_recalled`). A cache is never trusted as found,
    and never fails a caller."""
    try:
        return _recalled(loads_json(cache_path(key).read_bytes()), key)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        logger.warning("the batch-invariance result kept for this runtime is not used (%s); measuring again", exc)
        return None


#: A report row's fields and their JSON types (a bool is not a number here).
_ROW_TYPES: dict[str, tuple[type, ...]] = {
    "k": (int,), "start": (int,), "bitwise": (bool,), "max_diff": (int, float), "kl": (int, float),
    "argmax_same": (bool,),
}  # fmt: skip


def _recalled(saved: Any, key: dict[str, Any]) -> int:
    """``max_batch`` of a saved report if it is one `measure` (or `measure_sequences`) gives for ``key``: the
    same key, a whole number from 1 to `MAX_BATCH` (``key``'s ``sequences`` for sequences), and rows that
    prove it (every k from 2 to it measured, every row up to it bitwise); else `ValueError`."""
    if not isinstance(saved, dict) or set(saved) != {"key", "max_batch", "rows"}:
        raise ValueError("it is not a saved report")
    if json.dumps(saved["key"], sort_keys=True) != json.dumps(key, sort_keys=True):
        raise ValueError("it was measured for another runtime")
    sequences = key.get("sequences")
    limit = sequences if type(sequences) is int else MAX_BATCH
    max_batch, rows = saved["max_batch"], saved["rows"]
    if type(max_batch) is not int or not 1 <= max_batch <= limit:
        raise ValueError(f"max_batch {max_batch!r} is not a batch from 1 to {limit}")
    if not isinstance(rows, list) or not all(map(_is_row, rows)):
        raise ValueError("its rows are not a report's")
    proven = {row["k"] for row in rows if row["bitwise"]}
    if any(not row["bitwise"] for row in rows if row["k"] <= max_batch) or not proven >= set(range(2, max_batch + 1)):
        raise ValueError(f"its rows do not prove max_batch {max_batch}")
    return max_batch


def _is_row(row: Any) -> bool:
    """Whether ``row`` is an `InvarianceRow` as JSON: its fields, each of its type."""
    return (
        isinstance(row, dict)
        and set(row) == set(_ROW_TYPES)
        and all(
            isinstance(row[f], kinds) and (bool in kinds or type(row[f]) is not bool) for f, kinds in _ROW_TYPES.items()
        )
    )


def remember(key: dict[str, Any], report: InvarianceReport) -> None:
    """Keep ``report`` for ``key``; a read-only cache only costs a measurement next time."""
    path = cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, **report.to_json()}, indent=1))
        tmp.replace(path)
    except OSError as exc:
        logger.warning("cannot keep the batch-invariance result in %s: %s", path, exc)


class LookupBatch:
    """The largest batch lookup decoding may verify for one runtime (its ``fingerprint`` and thread count):
    measured once, through ``run_exclusive`` (the engine's), then read from the cache."""

    def __init__(
        self,
        fingerprint: dict[str, Any],
        n_threads: int,
        run_exclusive: Callable[[Callable[[Backend], InvarianceReport]], Any],
    ) -> None:
        unrelated = ("format", "template", "prefill_chunking")  # what a state's bytes depend on, not a batch's logits
        self.key = {**{k: v for k, v in fingerprint.items() if k not in unrelated}, "n_threads": n_threads}
        self._run_exclusive = run_exclusive
        self._max_batch: int | None = None

    @property
    def max_batch(self) -> int:
        """The largest batch proven bitwise equal to one-token steps (1: none is)."""
        if self._max_batch is None:
            remembered = recall(self.key)
            self._max_batch = remembered if remembered is not None else self.measure().max_batch
        return self._max_batch

    #: What is measured, and how its result is logged.
    _measure: Callable[[Backend], InvarianceReport] = staticmethod(measure)
    _measured = "batch invariance measured: lookup decoding may verify %d tokens at once"

    def measure(self) -> InvarianceReport:
        """Measure now, remember the result for ``key`` and use it from now on."""
        report: InvarianceReport = self._run_exclusive(self._measure)
        logger.info(self._measured, report.max_batch)
        remember(self.key, report)
        self._max_batch = report.max_batch
        return report

    def for_request(self, decode: str, backend: Backend, notes: list[str]) -> int:
        """The batch one request's decoder may verify: 1 means step decoding. Asked for ``lookup`` where it
        cannot be used, the reason joins ``notes``. Call it before a prefill: a first measurement clears the
        cache."""
        if decode == "step":
            return 1
        if backend.layout.recurrent:
            reason = f"a recurrent ({backend.arch}) model cannot drop rejected draft tokens"
            batch = 1
        else:
            batch = self.max_batch
            reason = "batches are not proven bitwise equal to one-token steps on this build, model and settings"
        if batch < 2 and decode == "lookup":
            notes.append(f"lookup decoding not used: {reason} (kvgraft doctor --invariance)")
        return max(batch, 1)


class SequenceBatch(LookupBatch):
    """The most sequences the scheduler may decode together for one runtime (its fingerprint, thread count
    and ``n_seq``): measured once (`measure_sequences`), then read from the same cache as `LookupBatch`."""

    def __init__(
        self,
        fingerprint: dict[str, Any],
        n_threads: int,
        n_seq: int,
        run_exclusive: Callable[[Callable[[Backend], InvarianceReport]], Any],
    ) -> None:
        super().__init__(fingerprint, n_threads, run_exclusive)
        self.key = {**self.key, "sequences": n_seq}

    _measure = staticmethod(measure_sequences)
    _measured = "sequences decoded together bitwise as alone: up to %d"
