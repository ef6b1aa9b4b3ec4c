"""llama.cpp's sequence-state bytes, read without trusting them: what a saved state holds.

Pure Python over the byte layout of llama-cpp-python 0.3.36 (`PINNED_VERSION`); it loads no native code,
so the state checks are tested on crafted bytes in the fast tier.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvgraft_plugin.core.exceptions import IntegrityError
from kvgraft_plugin.core.statefile import StateLayout

__all__ = ["PINNED_VERSION", "SEQ_STATE_MAGIC", "SeqStateInfo", "for_stream_context", "inspect_seq_state"]

#: The llama-cpp-python release whose state byte layout `inspect_seq_state` follows.
PINNED_VERSION = "0.3.36"
#: Magic that ``llama_state_seq_get_data`` writes before the sequence id (llama-context.cpp, io_magic).
SEQ_STATE_MAGIC = 0xAF143CD8
_SEQ_HEADER = struct.Struct("<Ii")
_U32 = struct.Struct("<I")
_LAYER_HEADER = struct.Struct("<iQ")
_VTRANS_HEADER = struct.Struct("<iII")


@dataclass(frozen=True)
class SeqStateInfo:
    """What a sequence-framed state holds, read from its bytes without trusting them."""

    n_tokens: int
    """Highest position + 1: the number of prefix tokens the state represents."""
    n_cells: tuple[int, ...]
    """Cells per attention KV section (one for a dense model; base and SWA caches for Gemma 3)."""
    k_types: tuple[int, ...]
    """ggml type ids of the K rows, one per KV section."""
    v_types: tuple[int, ...]
    """ggml type ids of the V rows, one per KV section."""
    recurrent_types: tuple[int, ...] = ()
    """ggml type ids of a recurrent state's R and S rows (empty without one)."""
    kv_spans: tuple[tuple[int, int], ...] = ()
    """Each KV section's byte range, from its stream count to its last row."""


def inspect_seq_state(payload: bytes | bytearray | memoryview, layout: StateLayout | None = None) -> SeqStateInfo:
    """Walk a sequence-framed state and check every length and field against the buffer.

    The walk follows ``llama_kv_cache::state_write`` and ``llama_memory_recurrent::state_write`` of the
    pinned llama.cpp, section by section as ``layout`` says (``None``: one or more KV sections). A KV
    section must hold one stream whose cells all belong to sequence 0 only, with distinct positions, and
    per-cell extras exactly when the layout has them (M-RoPE); a recurrent section (a recurrent model's,
    or a hybrid's after its KV) holds sequence 0's cells, written sequence-agnostic, and two rows per
    recurrent layer. Anything else is refused with `IntegrityError` before the bytes can reach native code.
    """
    view = memoryview(payload).cast("B")
    size = len(view)
    offset = 0

    def take(n: int) -> memoryview:
        nonlocal offset
        if n < 0 or offset + n > size:
            raise IntegrityError(f"KV state truncated at byte {offset} (needs {n} more, has {size - offset})")
        chunk = view[offset : offset + n]
        offset += n
        return chunk

    magic, seq_id = _SEQ_HEADER.unpack(take(_SEQ_HEADER.size))
    if magic != SEQ_STATE_MAGIC or seq_id != 0:
        raise IntegrityError(f"not a sequence-0 KV state (magic {magic:#x}, seq {seq_id})")

    def positions(cell_count: int, n_seq_id: int, what: str, ext: int = 0) -> int:
        """Read the cells' metadata: pos (i32), n_seq_id (u32), ``ext`` more fields (``llama_kv_cell_ext``:
        M-RoPE's x and y, and the cell's token, -1 for an embedding), that many seq ids (i32); the highest pos."""
        width = 2 + ext + n_seq_id
        meta = np.frombuffer(take(4 * width * cell_count), dtype="<i4").reshape(cell_count, width)
        if not (np.all(meta[:, 1] == n_seq_id) and np.all(meta[:, 2 + ext :] == 0)) or (ext and meta[:, 4].min() < -1):
            raise IntegrityError(f"{what} has cells outside sequence 0, or a layout this build does not know")
        pos = meta[:, 0]
        if pos.min() < 0 or len(np.unique(pos)) != cell_count or (ext and meta[:, 2:4].min() < 0):
            raise IntegrityError(f"{what} has negative or repeated positions")
        return int(pos.max())

    n_cells: list[int] = []
    k_types: list[int] = []
    v_types: list[int] = []
    recurrent_types: tuple[int, ...] = ()
    max_pos = -1
    kv_sections = layout.kv_sections if layout is not None else None
    kv_spans: list[tuple[int, int]] = []
    attention_layers = 0
    while offset < size and (kv_sections is None or len(n_cells) < kv_sections):
        section_start = offset
        (n_stream,) = _U32.unpack(take(4))
        if n_stream != 1:
            raise IntegrityError(f"KV state has {n_stream} streams; only single-stream contexts are supported")
        (cell_count,) = _U32.unpack(take(4))
        if cell_count == 0:
            raise IntegrityError("KV state section holds no cells")
        ext = 3 if layout is not None and layout.cell_ext else 0
        max_pos = max(max_pos, positions(cell_count, 1, "KV state", ext))  # one seq id each
        v_trans, n_layer = struct.unpack("<II", take(8))
        if v_trans not in (0, 1) or n_layer == 0 or n_layer > 1024:
            raise IntegrityError(f"KV state has a bad layer header (v_trans={v_trans}, n_layer={n_layer})")
        attention_layers += n_layer
        section_k = {_read_rows(take, cell_count) for _ in range(n_layer)}
        if v_trans:
            section_v = {_read_transposed(take, cell_count) for _ in range(n_layer)}
        else:
            section_v = {_read_rows(take, cell_count) for _ in range(n_layer)}
        if len(section_k) != 1 or len(section_v) != 1:
            raise IntegrityError("KV state mixes element types across layers")
        kv_spans.append((section_start, offset))
        n_cells.append(cell_count)
        k_types.append(section_k.pop())
        v_types.append(section_v.pop())
    if kv_sections is not None and len(n_cells) != kv_sections:
        raise IntegrityError(f"state holds {len(n_cells)} KV sections; {layout.describe()} has {kv_sections}")  # type: ignore[union-attr]
    if layout is not None and layout.recurrent:
        (cell_count,) = _U32.unpack(take(4))
        if cell_count == 0:
            raise IntegrityError("recurrent state holds no cells")
        max_pos = max(max_pos, positions(cell_count, 0, "recurrent state"))  # written sequence-agnostic
        s_trans, n_layer = struct.unpack("<II", take(8))
        if s_trans != 0 or n_layer == 0 or n_layer > 1024:
            raise IntegrityError(f"recurrent state has a bad layer header (s_trans={s_trans}, n_layer={n_layer})")
        # R rows, then S rows, of each recurrent layer: every layer of a recurrent model, the layers beside
        # the attention ones in a hybrid (n_layer counts all of them; the attention layers are skipped)
        rows: list[int] = []
        while offset < size and len(rows) < 2 * n_layer:
            rows.append(_read_rows(take, cell_count, empty=True))
        recurrent_layers = len(rows) // 2
        if len(rows) % 2 or not rows or (layout.kv_sections == 0 and recurrent_layers != n_layer):
            raise IntegrityError(f"recurrent state has {len(rows)} rows for {n_layer} layers")
        if attention_layers > n_layer:  # Falcon-H1 runs both in every layer; the others alternate
            raise IntegrityError(f"hybrid state has {attention_layers} attention layers of {n_layer}")
        recurrent_types = tuple(sorted(set(rows)))
    if offset != size:
        raise IntegrityError(f"state has {size - offset} bytes past its last section")
    if not n_cells and not recurrent_types:
        raise IntegrityError("state holds no cache section")
    return SeqStateInfo(max_pos + 1, tuple(n_cells), tuple(k_types), tuple(v_types), recurrent_types, tuple(kv_spans))


def for_stream_context(payload: bytes | bytearray | memoryview, layout: StateLayout, n_stream: int) -> bytearray:
    """A single-stream state (`inspect_seq_state`'s) framed for a context of ``n_stream`` KV streams, one
    per sequence (``kv_unified=false``).

    ``llama_kv_cache::state_read`` wants a sequence's state to list every stream of the context, and writes
    each non-empty one into the stream of the sequence it is loaded into. So each KV section keeps its
    cells and is followed by ``n_stream - 1`` empty streams. A recurrent section has no streams: it follows
    as it is (``llama_memory_recurrent::state_read`` puts its cell in the sequence's own).
    """
    info = inspect_seq_state(payload, layout)
    view = memoryview(payload).cast("B")
    out = bytearray(view[: _SEQ_HEADER.size])
    empty = _U32.pack(0) * (n_stream - 1)
    for start, end in info.kv_spans:
        out += _U32.pack(n_stream)
        out += view[start + 4 : end]
        out += empty
    out += view[info.kv_spans[-1][1] if info.kv_spans else _SEQ_HEADER.size :]
    return out


def _read_rows(take: Any, cell_count: int, *, empty: bool = False) -> int:
    """Skip one layer's rows and return their type; ``empty`` allows rows of 0 bytes (a short-convolution
    layer of LFM2 has no S state)."""
    type_id, row_size = _LAYER_HEADER.unpack(take(_LAYER_HEADER.size))
    if (row_size == 0 and not empty) or row_size > 1 << 24:
        raise IntegrityError(f"KV state has an implausible row size {row_size}")
    take(row_size * cell_count)
    return int(type_id)


def _read_transposed(take: Any, cell_count: int) -> int:
    type_id, el_size, n_embd = _VTRANS_HEADER.unpack(take(_VTRANS_HEADER.size))
    if el_size == 0 or el_size > 8 or n_embd == 0 or n_embd > 1 << 20:
        raise IntegrityError(f"KV state has an implausible V layout ({el_size} B x {n_embd})")
    take(el_size * n_embd * cell_count)
    return int(type_id)
