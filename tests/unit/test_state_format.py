import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgraft_plugin import IncompatibleStateError, IntegrityError
from kvgraft_plugin.adapters.llama_state import SEQ_STATE_MAGIC, for_stream_context, inspect_seq_state
from kvgraft_plugin.core.statefile import (
    StateLayout,
    atomic_write,
    check_fingerprint,
    decode_state,
    encode_state,
    read_file,
)

FP = {"gguf_sha256": "ab" * 32, "type_k": "f16", "flash_attn": False}


def make_payload(n_tokens=5, n_layer=2, row=8, sections=1, seq=0, v_trans=0, ext=None):
    """A structurally valid sequence-framed KV state, as llama_kv_cache::state_write lays it out; with
    ``ext(pos)``, each cell carries its ``llama_kv_cell_ext`` (M-RoPE's x, y and the cell's token)."""
    out = struct.pack("<Ii", SEQ_STATE_MAGIC, 0)
    for _ in range(sections):
        out += struct.pack("<II", 1, n_tokens)
        for pos in range(n_tokens):
            out += struct.pack("<iI", pos, 1)
            if ext is not None:
                out += struct.pack("<iii", *ext(pos))
            out += struct.pack("<i", seq)
        out += struct.pack("<II", v_trans, n_layer)
        for _ in range(n_layer):
            out += struct.pack("<iQ", 1, row) + bytes(row * n_tokens)
        for _ in range(n_layer):
            if v_trans:
                out += struct.pack("<iII", 1, 2, row // 2) + bytes(row * n_tokens)
            else:
                out += struct.pack("<iQ", 1, row) + bytes(row * n_tokens)
    return bytearray(out)


def test_roundtrip_keeps_everything():
    payload = make_payload()
    data = encode_state("e1", [1, 2, 3], FP, payload)
    state = decode_state(bytearray(data))
    assert state.entry_id == "e1" and state.tokens == (1, 2, 3) and dict(state.fingerprint) == FP
    assert bytes(state.payload) == bytes(payload)
    assert state.nbytes == len(data)


def test_every_single_bit_flip_is_caught():
    data = encode_state("e1", [1, 2, 3], FP, make_payload(n_tokens=2, n_layer=1, row=4))
    decode_state(bytearray(data))  # the unflipped file decodes, so each refusal below is the flip's
    for i in range(len(data)):
        for bit in (0, 7):
            flipped = bytearray(data)
            flipped[i] ^= 1 << bit
            with pytest.raises(IntegrityError):
                decode_state(flipped)


@pytest.mark.parametrize("cut", [0, 1, 15, 16, 40, -33, -1])
def test_truncation_is_caught(cut):
    data = encode_state("e1", [1, 2, 3], FP, make_payload())
    with pytest.raises(IntegrityError):
        decode_state(bytearray(data[:cut]))


def test_manifest_digest_must_match():
    data = encode_state("e1", [1], FP, make_payload())
    other = encode_state("e1", [1], FP, make_payload(row=16))
    with pytest.raises(IntegrityError, match="replaced"):
        decode_state(bytearray(other), expected_digest=bytes(data[-32:]).hex())


def test_fingerprint_mismatch_names_the_keys():
    with pytest.raises(IncompatibleStateError, match="type_k"):
        check_fingerprint(FP, {**FP, "type_k": "q8_0"})
    check_fingerprint(FP, dict(FP))


@given(st.binary(max_size=300))
@settings(max_examples=300, deadline=None)
def test_decode_never_crashes_on_garbage(blob):
    with pytest.raises(IntegrityError):
        decode_state(bytearray(blob))


@given(st.binary(min_size=1, max_size=64))
@settings(max_examples=200, deadline=None)
def test_header_fuzz_with_a_valid_checksum(header):
    """A well-checksummed file whose header is arbitrary bytes is still refused cleanly."""
    import hashlib

    body = bytearray(struct.pack("<8sII", b"KVGRAFT\0", 1, len(header))) + header + make_payload()
    data = body + hashlib.blake2b(body, digest_size=32).digest()
    with pytest.raises(IntegrityError):
        decode_state(data)


def test_inspect_accepts_valid_layouts():
    info = inspect_seq_state(make_payload(n_tokens=7, sections=2))
    assert info.n_tokens == 7 and info.n_cells == (7, 7) and info.k_types == (1, 1)
    assert inspect_seq_state(make_payload(v_trans=1)).v_types == (1,)


@pytest.mark.parametrize(
    "payload",
    [
        make_payload(seq=1),
        make_payload()[:-1],
        make_payload() + b"\0",
        bytearray(struct.pack("<Ii", 0x12345678, 0)) + make_payload()[8:],
        bytearray(struct.pack("<Ii", SEQ_STATE_MAGIC, 0)),
        make_payload(row=0),
    ],
    ids=["foreign-seq", "truncated", "trailing", "bad-magic", "no-sections", "zero-row"],
)
def test_inspect_refuses_malformed(payload):
    with pytest.raises(IntegrityError):
        inspect_seq_state(payload)


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_inspect_never_crashes(blob):
    with pytest.raises(IntegrityError):
        inspect_seq_state(struct.pack("<Ii", SEQ_STATE_MAGIC, 0) + blob)


def test_atomic_write_and_read(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    atomic_write(target, b"abc")
    assert read_file(target) == bytearray(b"abc")
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]


def make_recurrent(n_layer=2, pos=6, n_seq_id=0, r_row=12, s_row=32, written=None, magic=True):
    """A recurrent state as llama_memory_recurrent::state_write lays out sequence 0's: one cell; the R rows,
    then the S rows, of the ``written`` recurrent layers of ``n_layer`` (all of them by default)."""
    written = n_layer if written is None else written
    out = struct.pack("<Ii", SEQ_STATE_MAGIC, 0) if magic else b""
    out += struct.pack("<IiI", 1, pos, n_seq_id) + b"\0" * 4 * n_seq_id
    out += struct.pack("<II", 0, n_layer)
    for row in [r_row] * written + [s_row] * written:
        out += struct.pack("<iQ", 0, row) + bytes(row)
    return bytearray(out)


def make_hybrid(n_tokens=5, attention=1, n_layer=3, written=2, s_row=32, ext=None):
    """A hybrid state (llama_memory_hybrid::state_write): the attention layers' KV, then the recurrent
    layers' rows; ``n_layer`` counts every layer of the model."""
    kv = make_payload(n_tokens=n_tokens, n_layer=attention, ext=ext)
    return kv + make_recurrent(n_layer=n_layer, pos=n_tokens - 1, written=written, s_row=s_row, magic=False)


HYBRID = StateLayout(1, recurrent=True)


def test_inspect_walks_a_hybrid_state():
    info = inspect_seq_state(make_hybrid(), HYBRID)
    assert info.n_tokens == 5 and info.n_cells == (5,) and info.recurrent_types == (0,)
    assert inspect_seq_state(make_hybrid(s_row=0), HYBRID).n_tokens == 5  # LFM2's conv layers keep no S rows
    assert inspect_seq_state(make_hybrid(attention=2, n_layer=2, written=2), HYBRID).n_cells == (5,)  # Falcon-H1
    assert HYBRID.describe() == "attention KV + recurrent state"


@pytest.mark.parametrize(
    "payload",
    [
        make_hybrid()[:-1],
        make_hybrid() + b"\0",
        make_hybrid(attention=4, n_layer=3),  # more attention layers than the model has
        make_hybrid(written=0),  # no recurrent rows
        make_hybrid(written=4, n_layer=3),  # more recurrent layers than the model has
        make_payload(),  # the KV alone
        make_hybrid() + struct.pack("<iQ", 0, 32) + bytes(32),  # an odd number of rows
    ],
    ids=["truncated", "trailing", "attention-layers", "no-rows", "recurrent-layers", "kv-only", "odd-rows"],
)
def test_inspect_refuses_a_malformed_hybrid(payload):
    with pytest.raises(IntegrityError):
        inspect_seq_state(payload, HYBRID)


def test_a_recurrent_model_writes_every_layer():
    with pytest.raises(IntegrityError, match="rows for 3 layers"):
        inspect_seq_state(make_recurrent(n_layer=3, written=2), StateLayout(0, recurrent=True))


MROPE = StateLayout(1, cell_ext=True)


def test_inspect_walks_m_rope_cells():
    """An M-RoPE cell keeps its 2-D position and its token (-1 for an image embedding)."""
    payload = make_payload(ext=lambda pos: (pos, pos, 10 + pos))
    assert inspect_seq_state(payload, MROPE).n_tokens == 5
    assert inspect_seq_state(make_payload(ext=lambda pos: (3, 1, -1)), MROPE).n_tokens == 5
    assert inspect_seq_state(make_hybrid(ext=lambda pos: (pos, pos, 7)), StateLayout(1, True, True)).n_tokens == 5
    assert MROPE.describe() == "attention KV with M-RoPE positions"
    with pytest.raises(IntegrityError):  # the layouts are told apart: 12 bytes more per cell
        inspect_seq_state(payload, StateLayout(1))
    with pytest.raises(IntegrityError):
        inspect_seq_state(make_payload(), MROPE)


@pytest.mark.parametrize("ext", [lambda pos: (-1, 0, 5), lambda pos: (0, -2, 5), lambda pos: (0, 0, -2)])
def test_inspect_refuses_bad_m_rope_cells(ext):
    with pytest.raises(IntegrityError):
        inspect_seq_state(make_payload(ext=ext), MROPE)


def test_inspect_walks_a_recurrent_state_by_its_layout():
    info = inspect_seq_state(make_recurrent(), StateLayout(0, recurrent=True))
    assert info.n_tokens == 7 and info.n_cells == () and info.recurrent_types == (0,)
    for bad in (make_recurrent(n_seq_id=1), make_recurrent()[:-1], make_recurrent() + b"\0"):
        with pytest.raises(IntegrityError):
            inspect_seq_state(bad, StateLayout(0, recurrent=True))
    with pytest.raises(IntegrityError):  # a KV state is not a recurrent one, nor one KV section two
        inspect_seq_state(make_payload(), StateLayout(0, recurrent=True))
    with pytest.raises(IntegrityError, match="KV sections"):
        inspect_seq_state(make_payload(), StateLayout(2))
    assert inspect_seq_state(make_payload(sections=2), StateLayout(2)).n_cells == (5, 5)
    assert StateLayout(2, recurrent=True).describe() == "attention KV (base + sliding-window caches) + recurrent state"


def test_a_state_is_framed_for_a_context_of_several_streams():
    """Each KV section lists every stream of the context: its own cells, then empty streams (cell count 0),
    as ``llama_kv_cache::state_read`` wants for a sequence of a ``kv_unified=false`` context."""
    payload = make_payload(n_tokens=6, sections=2)
    info = inspect_seq_state(payload, StateLayout(2))
    framed = for_stream_context(payload, StateLayout(2), 4)
    assert len(framed) == len(payload) + 2 * 3 * 4
    assert framed[:8] == payload[:8]
    offset = 8
    for start, end in info.kv_spans:
        assert struct.unpack_from("<I", framed, offset)[0] == 4
        body = payload[start + 4 : end]
        assert framed[offset + 4 : offset + 4 + len(body)] == body
        offset += 4 + len(body)
        assert struct.unpack_from("<3I", framed, offset) == (0, 0, 0)
        offset += 12
    assert offset == len(framed)
    assert for_stream_context(payload, StateLayout(2), 1) == payload


def test_a_recurrent_section_is_kept_as_it_is_for_a_context_of_several_sequences():
    """A recurrent state has no streams (llama.cpp gives each sequence its own cell); a hybrid's KV is framed
    and its recurrent rows follow unchanged."""
    recurrent = make_recurrent()
    assert for_stream_context(recurrent, StateLayout(0, recurrent=True), 4) == recurrent
    hybrid = make_hybrid()
    kv_end = inspect_seq_state(hybrid, HYBRID).kv_spans[-1][1]
    framed = for_stream_context(hybrid, HYBRID, 4)
    assert framed[8:12] == struct.pack("<I", 4) and framed.endswith(hybrid[kv_end:])
    assert len(framed) == len(hybrid) + 3 * 4
    assert inspect_seq_state(for_stream_context(hybrid, HYBRID, 1), HYBRID) == inspect_seq_state(hybrid, HYBRID)
