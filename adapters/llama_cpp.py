"""The llama.cpp backend: a pinned context, chunked prefill, and exact KV capture/restore.

Exactness on sliding-window models (Gemma 3) rests on one measured fact: the per-sequence save of
llama.cpp drops SWA-masked cells, and a restore then lays the cache out differently from the original,
which changes attention's float reductions. So we capture **every** cell with the whole-context writer
(``llama_state_get_data``), turn its framing into the sequence framing (strip the architecture string,
prepend the 8-byte sequence header) and load it with ``llama_state_seq_set_data`` into a cleared
context. The sequence loader places the cells from cell 0 in their saved order and leaves the head after
them, exactly as the original prefill did.

``Llama.save_state``/``load_state`` are not used: they are wrong on Gemma 3 past its window, and slow.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from kvgraft_plugin.core.config import KV_TYPE_BYTES, KV_TYPES, LlamaConfig
from kvgraft_plugin.core.exceptions import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    IncompatibleStateError,
    IntegrityError,
)
from kvgraft_plugin.core.sampling import SamplingParams
from kvgraft_plugin.core.statefile import StateLayout
from kvgraft_plugin.library.fingerprint import chunk_sizes

from .llama_state import (
    _SEQ_HEADER,
    _U32,
    PINNED_VERSION,
    SEQ_STATE_MAGIC,
    SeqStateInfo,
    for_stream_context,
    inspect_seq_state,
)

try:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
except ImportError as exc:  # pragma: no cover - llama-cpp-python is a core dependency
    raise ImportError("kvgraft needs llama-cpp-python: pip install 'llama-cpp-python==0.3.36'") from exc

__all__ = ["ChainSampler", "LlamaBackend", "SeqStateInfo", "inspect_seq_state", "llama_cpp_version", "tiled_matmul"]

logger = logging.getLogger(__name__)


def tiled_matmul() -> bool:
    """Whether ggml's tiled K-quant matmul is on in this process (it changes the bits of batches of 8+)."""
    try:
        return int(os.environ.get("GGML_CPU_TILED_MM", "1")) != 0
    except ValueError:  # ggml's atoi reads a non-number as 0
        return False


def available_memory() -> int | None:
    """Bytes of memory free for new allocations now (Linux ``MemAvailable``; ``None`` where unknown)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def grammar_for_json(schema: str | None = None) -> str:
    """GBNF for the JSON documents valid under ``schema`` (JSON Schema text), as llama-cpp-python converts
    it (``json_schema_to_gbnf``); for any JSON object without one (``JSON_GBNF``)."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    return str(JSON_GBNF) if schema is None else str(json_schema_to_gbnf(schema))


def llama_cpp_version() -> str:
    """The llama-cpp-python version: it pins the state byte format."""
    return str(llama_cpp.__version__)


# llama.cpp logs through this callback into Python logging instead of printing on stderr.
@llama_cpp.llama_log_callback
def _log_to_logging(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace").rstrip()
    if message:
        logger.debug("llama.cpp: %s", message)


_init_lock = threading.Lock()
_initialized = False


def _init_llama_backend() -> None:
    """llama.cpp's backend, initialised once, when the first model of this process is opened (not at import).

    ggml's tiled K-quant matmul (CPU backend, batches of 8 or more rows; read once per process, at the first
    matmul) sums in another order than the one-row kernel: on Gemma 3 Q4_K_M a batch of 8 tokens then gave
    logits up to 4.4 away from 8 one-token steps, so lookup decoding could verify at most 7 tokens. Off it,
    batches of 16 were bitwise equal, at ~6% of prefill speed. So it is switched off here, before any model
    runs, unless the user set ``GGML_CPU_TILED_MM``; the fingerprint records which (`tiled_matmul`).
    """
    global _initialized
    with _init_lock:
        if not _initialized:
            os.environ.setdefault("GGML_CPU_TILED_MM", "0")
            llama_cpp.llama_log_set(_log_to_logging, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialized = True


class LlamaBackend:
    """One GGUF model and one pinned llama.cpp context for ``n_seq`` sequences.

    With ``n_seq`` > 1 every sequence has a KV stream of its own of ``n_ctx`` cells (``kv_unified=false``):
    a sequence decoded beside others then gets bitwise the logits it gets alone (measured on Gemma 3 270M,
    SmolLM2-135M and Qwen2.5-Coder-1.5B, 2 to 8 sequences; with one unified cache, where the sequences'
    cells share the attention rows, they differed by up to 2.6). Every call acts on the sequence chosen
    by `use_sequence` (0 at first); `decode_batch` feeds one token to each of several.

    Not thread-safe: only the engine's worker calls it.
    """

    def __init__(self, model_path: str | Path, config: LlamaConfig, *, n_seq: int = 1) -> None:
        path = Path(model_path)
        if not path.is_file():
            raise ConfigError(f"model file not found: {path}")
        _init_llama_backend()
        self.model_path = path
        self.config = config

        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = config.n_gpu_layers
        mparams.use_extra_bufts = config.repack
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise BackendError(f"llama.cpp could not load the model {path}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.arch = self.meta("general.architecture")
        self.n_seq = n_seq
        """Sequences this context holds, each in a KV stream of its own."""
        try:
            self._check_memory(n_seq)
        except ConfigError:
            llama_cpp.llama_model_free(self._model)
            raise
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = config.n_ctx * n_seq
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = config.n_ubatch
        cparams.n_seq_max = n_seq
        cparams.kv_unified = n_seq == 1
        cparams.n_threads = config.n_threads
        cparams.n_threads_batch = config.n_threads
        cparams.type_k = KV_TYPES[config.type_k]
        cparams.type_v = KV_TYPES[config.type_v]
        cparams.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if config.flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cparams.swa_full = config.swa_full
        cparams.embeddings = False
        cparams.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise BackendError(f"llama.cpp could not create a context for {path} with {config}")
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(max(config.n_batch, n_seq), 0, 1)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx))
        """Positions one sequence may hold."""
        self.n_batch = config.n_batch
        self.n_swa = int(llama_cpp.llama_model_n_swa(self._model))
        self.layout = _layout(self._model, self.n_swa)
        """What a captured state holds (`StateLayout`)."""
        self._seq = 0
        self._n_past = [0] * n_seq
        logger.info("loaded %s (%s, n_swa=%d, %d sequences) with %s", path.name, self.arch, self.n_swa, n_seq, config)

    # -- sequences ----------------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Positions the current sequence holds."""
        return self._n_past[self._seq]

    @n_past.setter
    def n_past(self, value: int) -> None:
        self._n_past[self._seq] = value

    def use_sequence(self, seq: int) -> None:
        """Make ``seq`` the sequence every later call acts on."""
        if not 0 <= seq < self.n_seq:
            raise ConfigError(f"sequence {seq} is not one of this context's {self.n_seq}")
        self._seq = seq

    def decode_batch(self, items: Sequence[tuple[int, int]]) -> None:
        """Feed one token to each of several sequences, ``(seq, token)`` pairs with distinct sequences, in
        one llama.cpp batch; ``sampler.sample(i)`` reads item ``i``'s logits."""
        if not 0 < len(items) <= self.n_seq or len({seq for seq, _ in items}) != len(items):
            raise ConfigError(f"a batch holds one token for each of 1 to {self.n_seq} distinct sequences")
        batch = self._batch
        batch.n_tokens = len(items)
        for i, (seq, token) in enumerate(items):
            if self._n_past[seq] >= self.n_ctx:
                raise ContextOverflowError(f"sequence {seq} holds n_ctx={self.n_ctx} positions already")
            batch.token[i] = token
            batch.pos[i] = self._n_past[seq]
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1
        rc = llama_cpp.llama_decode(self._ctx, batch)
        if rc != 0:
            raise BackendError(f"llama_decode failed with {rc} on a batch of {len(items)} sequences")
        for seq, _ in items:
            self._n_past[seq] += 1

    def _check_memory(self, n_seq: int) -> None:
        """Refuse a context whose KV cache does not fit in the memory free now (llama.cpp would abort)."""
        if n_seq < 1:
            raise ConfigError(f"a context holds at least one sequence, got {n_seq}")
        need = self.kv_bytes_per_token() * self.config.n_ctx * n_seq
        free = available_memory()
        if free is not None and need > free:
            raise ConfigError(
                f"{n_seq} sequences of n_ctx={self.config.n_ctx} need {need / 2**30:.2f} GiB of KV cache "
                f"({self.kv_bytes_per_token()} bytes a position each), and {free / 2**30:.2f} GiB is free: "
                "lower --max-batch or --n-ctx"
            )

    def kv_bytes_per_token(self) -> int:
        """K and V bytes one position takes in one sequence's cache (every layer; ``swa_full`` keeps the
        sliding-window layers' cells too)."""
        n_layer = int(llama_cpp.llama_model_n_layer(self._model))
        n_head_kv = int(llama_cpp.llama_model_n_head_kv(self._model))
        n_head = int(llama_cpp.llama_model_n_head(self._model))
        default = int(llama_cpp.llama_model_n_embd(self._model)) // max(n_head, 1)
        k_len = int(self.meta(f"{self.arch}.attention.key_length") or default)
        v_len = int(self.meta(f"{self.arch}.attention.value_length") or default)
        k_size, v_size = KV_TYPE_BYTES[self.config.type_k], KV_TYPE_BYTES[self.config.type_v]
        return int(n_layer * n_head_kv * (k_len * k_size + v_len * v_size))

    # -- model facts --------------------------------------------------------------------------------

    def meta(self, key: str) -> str:
        """A GGUF metadata value as a string ("" when absent)."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else ""

    def device(self) -> str:
        """Where the KV cache lives: "cpu", or "gpu" when layers are offloaded to one."""
        if self.config.n_gpu_layers != 0 and llama_cpp.llama_supports_gpu_offload():
            return "gpu"
        return "cpu"

    def runtime_facts(self) -> dict[str, Any]:
        """What this runtime is that changes the bits of a state
        (`kvgraft_plugin.library.fingerprint.RUNTIME_FACTS`)."""
        return {
            "llama_cpp_python": llama_cpp_version(),
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "tiled_matmul": tiled_matmul(),
            "arch": self.arch,
            "device": self.device(),
        }

    def check_state(self, payload: bytes | bytearray | memoryview, n_tokens: int) -> None:
        """Refuse bytes that are not a well-formed state of ``n_tokens`` positions in this context's KV types:
        `IntegrityError` (malformed, other length) or `IncompatibleStateError` (other KV types)."""
        info = inspect_seq_state(payload, self.layout)
        if info.n_tokens != n_tokens:
            raise IntegrityError(f"state holds {info.n_tokens} positions for {n_tokens} tokens")
        k_type, v_type = KV_TYPES[self.config.type_k], KV_TYPES[self.config.type_v]
        if not set(info.k_types) <= {k_type} or not set(info.v_types) <= {v_type}:
            raise IncompatibleStateError(f"state KV types {info.k_types}/{info.v_types} differ from the runtime's")

    # -- tokens -------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool, special: bool = False) -> list[int]:
        """Tokenize ``text``. Special-token syntax in it is plain text unless ``special`` (template markup)."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_bos, special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_bos, special)
        if n < 0:
            raise BackendError(f"tokenization failed ({n})")
        return list(buf[:n])

    def render_chat(self, messages: Sequence[tuple[str, str]], *, add_generation_prompt: bool, name: str | None) -> str:
        """``(role, content)`` messages through a chat template: llama.cpp's built-in ``name``, or with
        ``None`` the model's own (GGUF ``tokenizer.chat_template``, rendered with jinja2 as llama-cpp-python's
        ``Jinja2ChatFormatter`` does). The BOS token is left to the tokenizer, as every other prompt's."""
        if name is not None:
            return _apply_builtin_template(name, messages, add_generation_prompt)
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        if not raw:
            raise ConfigError(
                f"{self.model_path.name} has no chat template in its GGUF metadata; name one of llama.cpp's "
                "(--chat-template gemma, chatml, llama3, ...) or use --template text"
            )
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        formatter = Jinja2ChatFormatter(
            raw.decode(), eos_token=self._piece(eos, special=True).decode(errors="replace"), bos_token="",
            add_generation_prompt=add_generation_prompt,
        )  # fmt: skip
        try:
            return formatter(messages=cast(Any, [{"role": r, "content": c} for r, c in messages])).prompt
        except Exception as exc:  # jinja2's errors and the template's raise_exception
            raise ConfigError(f"the chat template of {self.model_path.name} failed: {exc}") from exc

    def token_bytes(self, token: int) -> bytes:
        """The UTF-8 bytes of one token (may be a partial character)."""
        return self._piece(token, special=False)

    def _piece(self, token: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # -- KV cache -----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the current sequence's KV cache (metadata only: zeroing 72 MB of buffers would cost ~8 ms).

        A cleared context restores and prefills bitwise like a fresh one; the tests check this. In a context
        of several sequences only the current one's stream is emptied.
        """
        if self.n_seq == 1:
            llama_cpp.llama_memory_clear(self._mem, False)
        elif not llama_cpp.llama_memory_seq_rm(self._mem, self._seq, -1, -1):
            raise BackendError(f"llama.cpp cannot empty sequence {self._seq}")
        self.n_past = 0

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed ``tokens`` after the current position in chunks of ``n_batch``.

        Returns a copy of the logits after the last token. The chunking (`chunk_sizes`: no single-token
        last chunk) depends only on ``len(tokens)``, so the same call sequence gives the same chunks on
        every route.
        """
        self._feed(tokens)
        return self.logits(-1)

    def decode(self, token: int) -> None:
        """Feed one decoded token; its logits stay in the context for `ChainSampler.sample`."""
        self._feed((token,))

    def verify(self, tokens: Sequence[int]) -> None:
        """Feed ``tokens`` as one batch with logits at every position (``sample(i)`` reads output ``i``).

        Bitwise equal to feeding them one at a time only on a build and settings that
        `kvgraft_plugin.engine.batch_invariance` proved batch-invariant up to ``len(tokens)``; the lookup
        decoder never asks for more."""
        if not 0 < len(tokens) <= self.n_batch:
            raise ConfigError(f"a verified batch holds 1 to n_batch={self.n_batch} tokens, got {len(tokens)}")
        self._feed(tokens, all_logits=True)

    def truncate(self, n_tokens: int) -> None:
        """Forget every position from ``n_tokens`` on (llama.cpp's ``llama_memory_seq_rm``)."""
        if n_tokens >= self.n_past:
            return
        if not llama_cpp.llama_memory_seq_rm(self._mem, self._seq, n_tokens, -1):
            raise BackendError(f"llama.cpp cannot drop positions {n_tokens}.. of this {self.arch} model's memory")
        self.n_past = n_tokens

    def logits(self, index: int = -1) -> np.ndarray:
        """A copy of output ``index``'s logits from the last batch fed."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, index), shape=(self.n_vocab,)).copy()

    def sampler(self, params: SamplingParams, history: Sequence[int]) -> ChainSampler:
        """A sampler chain for one request, its penalties primed with ``history`` (the context so far)."""
        return ChainSampler(self, params, history)

    def _feed(self, tokens: Sequence[int], *, all_logits: bool = False) -> None:
        if not tokens:
            raise ConfigError("prefill needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextOverflowError(f"{self.n_past} + {len(tokens)} tokens do not fit in n_ctx={self.n_ctx}")
        batch = self._batch
        start = 0
        for size in chunk_sizes(len(tokens), self.config.n_batch):
            chunk = tokens[start : start + size]
            start += size
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = self._seq
                batch.logits[i] = all_logits
            last = start == len(tokens)
            batch.logits[len(chunk) - 1] = 1 if last else 0
            rc = llama_cpp.llama_decode(self._ctx, batch)
            if rc != 0:
                raise BackendError(f"llama_decode failed with {rc} at position {self.n_past}")
            self.n_past += len(chunk)

    def capture_state(self) -> bytearray:
        """The whole KV cache, every cell, in sequence framing for `restore_state`.

        A recurrent or hybrid model's state is the sequence's own (``llama_state_seq_get_data``): it has no
        sliding-window cells to lose, and the sequence loader wants its recurrent cells written
        sequence-agnostic. Refused on another llama-cpp-python than `PINNED_VERSION` (the framing is that
        release's), and with `ConfigError` for a state that does not walk as its layout.
        """
        if llama_cpp_version() != PINNED_VERSION:
            raise BackendError(
                f"KV capture is written against llama-cpp-python {PINNED_VERSION}; {llama_cpp_version()} is installed"
            )
        if self.n_seq > 1:
            raise ConfigError("states are captured in a context of one sequence (max_batch=1), as libraries are built")
        payload = self._capture_sequence() if self.layout.recurrent else self._capture_every_cell()
        try:
            inspect_seq_state(payload, self.layout)
        except IntegrityError as exc:
            raise ConfigError(f"{self.arch}: its state is not laid out as {self.layout.describe()}: {exc}") from exc
        return payload

    def _capture_every_cell(self) -> bytearray:
        size = llama_cpp.llama_state_get_size(self._ctx)
        raw = bytearray(size)
        c_raw = (ctypes.c_uint8 * size).from_buffer(raw)
        written = llama_cpp.llama_state_get_data(self._ctx, c_raw, size)
        del c_raw
        if written == 0:
            raise BackendError("llama_state_get_data wrote nothing")
        (arch_len,) = _U32.unpack_from(raw, 0)
        arch = raw[4 : 4 + arch_len].decode("utf-8", errors="replace")
        if arch != self.arch:
            raise BackendError(f"state names architecture {arch!r}, the model is {self.arch!r}")
        body = memoryview(raw)[4 + arch_len : written]
        out = bytearray(_SEQ_HEADER.size + len(body))
        _SEQ_HEADER.pack_into(out, 0, SEQ_STATE_MAGIC, 0)
        out[_SEQ_HEADER.size :] = body
        return out

    def _capture_sequence(self) -> bytearray:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        raw = bytearray(size)
        c_raw = (ctypes.c_uint8 * size).from_buffer(raw)
        written = llama_cpp.llama_state_seq_get_data(self._ctx, c_raw, size, 0)
        del c_raw
        if written != size:
            raise BackendError(f"llama_state_seq_get_data wrote {written} of {size} bytes")
        return raw

    def restore_state(self, payload: bytearray | memoryview, n_tokens: int) -> None:
        """Clear the current sequence and load ``payload`` (from `capture_state`) into it.

        ``payload`` must be writable so that ctypes can hand its memory to llama.cpp without a copy. In a
        context of several sequences it is framed for their streams first (`for_stream_context`, a copy).
        """
        self.reset()
        if self.n_seq > 1:
            payload = for_stream_context(payload, self.layout, self.n_seq)
        view = memoryview(payload)
        size = view.nbytes
        c_buf = (ctypes.c_uint8 * size).from_buffer(view)
        read = llama_cpp.llama_state_seq_set_data(self._ctx, c_buf, size, self._seq)
        del c_buf
        if read != size:
            self.reset()
            raise BackendError(f"llama.cpp refused the KV state (read {read} of {size} bytes)")
        pos_max = int(llama_cpp.llama_memory_seq_pos_max(self._mem, self._seq))
        if pos_max != n_tokens - 1:
            self.reset()
            raise BackendError(f"restored cache ends at position {pos_max}, expected {n_tokens - 1}")
        self.n_past = n_tokens

    def close(self) -> None:
        """Free the context and the model."""
        if getattr(self, "_ctx", None):
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            llama_cpp.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass


#: ``llama_token_data`` as a numpy record, for the candidate array a grammar step builds.
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
#: How many of the most likely tokens a greedy grammar step shows the grammar before it masks them all.
_SHORTLIST = 1024


class ChainSampler:
    """llama.cpp's sampler chain for one request (`SamplingParams`), in llama.cpp's order: [penalties],
    then greedy, or top-k, top-p, min-p, temperature and a seeded draw. Free it with `close`. Plain greedy
    decoding (no penalties, no grammar) takes ``np.argmax`` of the logits in place, the greedy sampler's
    choice (its first maximum) without copying Gemma 3's 262k logits into a candidate array for every
    token (~1 ms; it matters once lookup decoding verifies a token in ~10 ms).

    A grammar is a sampler of its own, used as llama.cpp's ``common_sampler`` does: the chain picks from
    the whole vocabulary, and only when the grammar rejects that pick is the chain run again on the
    tokens the grammar allows. This draws from the same constrained distribution as masking first, at a
    fraction of the cost: masking Gemma 3's 262k tokens takes 60-400 ms a step. Greedy decoding without
    penalties goes further: the answer is the most likely allowed token, so the grammar only has to
    look at the best `_SHORTLIST` tokens, in order, before it masks the rest. Only the penalties are
    primed with the history: it is context, not output the grammar has to match.
    """

    def __init__(self, backend: LlamaBackend, params: SamplingParams, history: Sequence[int]) -> None:
        self._ctx = backend._ctx
        self._n_vocab = backend.n_vocab
        self._grammar = None
        self._shortlist = params.greedy and not params.penalized
        self._argmax = self._shortlist and params.grammar is None
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        if params.grammar is not None:
            self._grammar = llama_cpp.llama_sampler_init_grammar(backend._vocab, params.grammar.encode(), b"root")
            if not self._grammar:
                self.close()
                raise ConfigError("llama.cpp could not parse the grammar (GBNF with a root rule named 'root')")
            self._candidates = np.zeros(self._n_vocab, dtype=_TOKEN_DATA)
            self._candidates["id"] = np.arange(self._n_vocab, dtype=np.int32)
        if params.penalized:
            last_n = backend.n_ctx if params.penalty_last_n == -1 else params.penalty_last_n
            penalties = self._add(
                llama_cpp.llama_sampler_init_penalties(
                    backend.n_vocab, last_n, params.repeat_penalty, params.frequency_penalty, params.presence_penalty
                )
            )
            for token in history:
                llama_cpp.llama_sampler_accept(penalties, token)
        if params.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                self._add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
            self._add(llama_cpp.llama_sampler_init_dist(params.seed))

    def _add(self, sampler: Any) -> Any:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)  # the chain owns and frees it
        return sampler

    def sample(self, index: int = -1) -> int:
        """Choose the next token from output ``index``'s logits (``-1``: the last token fed), and record it
        in the chain (and grammar)."""
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, index), shape=(self._n_vocab,))
        if self._argmax:  # the greedy sampler's choice (the first maximum) without copying the vocabulary
            return int(np.argmax(logits))
        if self._grammar is None:
            return int(llama_cpp.llama_sampler_sample(self._chain, self._ctx, index))
        token = self._pick(logits, constrained=False)
        if not self._allowed(token, float(logits[token])):
            best = self._best_allowed(logits) if self._shortlist else None
            token = best if best is not None else self._pick(logits, constrained=True)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _pick(self, logits: np.ndarray, *, constrained: bool) -> int:
        """Run the chain (after the grammar's mask when ``constrained``) over every token; its choice."""
        candidates = self._candidates
        candidates["id"][:] = np.arange(self._n_vocab, dtype=np.int32)  # the chain may reorder them
        candidates["logit"] = logits
        candidates["p"] = 0.0
        array = llama_cpp.llama_token_data_array(
            data=candidates.ctypes.data_as(llama_cpp.llama_token_data_p), size=self._n_vocab, selected=-1, sorted=False
        )
        if constrained:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        if not 0 <= array.selected < array.size:
            raise BackendError("the sampler chain selected no token")
        return int(candidates["id"][array.selected])

    def _best_allowed(self, logits: np.ndarray) -> int | None:
        """The most likely token the grammar allows, if it is among the best `_SHORTLIST` and beats every
        token outside them (``None``: mask the whole vocabulary instead)."""
        best = np.sort(np.argpartition(logits, -_SHORTLIST)[-_SHORTLIST:])
        best = best[np.argsort(-logits[best], kind="stable")]  # ties: lower id first, as the greedy sampler
        shortlist = np.zeros(_SHORTLIST, dtype=_TOKEN_DATA)
        shortlist["id"], shortlist["logit"] = best, logits[best]
        array = llama_cpp.llama_token_data_array(
            data=shortlist.ctypes.data_as(llama_cpp.llama_token_data_p), size=_SHORTLIST, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        allowed = np.flatnonzero(np.isfinite(shortlist["logit"]))
        if not len(allowed) or logits[shortlist["id"][allowed[0]]] <= logits[best[-1]]:
            return None  # none allowed, or a token left out could tie with the choice
        return int(shortlist["id"][allowed[0]])

    def _allowed(self, token: int, logit: float) -> bool:
        """Whether the grammar accepts ``token`` next (it masks a rejected one to -inf)."""
        one = llama_cpp.llama_token_data(id=token, logit=logit, p=0.0)
        array = llama_cpp.llama_token_data_array(data=ctypes.pointer(one), size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return bool(np.isfinite(one.logit))

    def close(self) -> None:
        """Free the chain, its samplers and the grammar."""
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None


#: RoPE types whose KV cells keep a llama_kv_cell_ext: x, y and the token (llama_hparams::n_pos_per_embd > 1).
_MROPE_TYPES = (llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_IMROPE)


def _layout(model: Any, n_swa: int) -> StateLayout:
    """The state layout of ``model``: attention KV (a second cache for sliding-window layers), then the
    recurrent layers' state of a recurrent or hybrid model."""
    if llama_cpp.llama_model_is_recurrent(model):
        return StateLayout(kv_sections=0, recurrent=True)
    return StateLayout(
        kv_sections=2 if n_swa > 0 else 1,
        recurrent=bool(llama_cpp.llama_model_is_hybrid(model)),
        cell_ext=llama_cpp.llama_model_rope_type(model) in _MROPE_TYPES,
    )


def _apply_builtin_template(name: str, messages: Sequence[tuple[str, str]], add_generation_prompt: bool) -> str:
    """Render with one of llama.cpp's built-in chat templates (``llama_chat_apply_template``)."""
    names = (ctypes.c_char_p * 256)()
    known = {(names[i] or b"").decode() for i in range(min(llama_cpp.llama_chat_builtin_templates(names, 256), 256))}
    if name not in known:
        raise ConfigError(f"{name!r} is not one of llama.cpp's chat templates: {', '.join(sorted(known))}")
    encoded = [(role.encode(), content.encode()) for role, content in messages]
    chat = (llama_cpp.llama_chat_message * max(len(encoded), 1))()
    for slot, (role, content) in zip(chat, encoded):
        slot.role, slot.content = role, content
    size = 2 * sum(len(r) + len(c) for r, c in encoded) + 1024
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(encoded), add_generation_prompt, buf, size)
        if n < 0:
            raise ConfigError(f"llama.cpp's chat template {name!r} failed ({n})")
        if n <= size:
            return buf.raw[:n].decode()
        size = n
    raise BackendError(f"llama.cpp's chat template {name!r} kept growing")  # pragma: no cover
