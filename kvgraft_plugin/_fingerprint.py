"""What a saved state's bits depend on: the settings that must match, and those measured harmless.

A library is built once and used on many machines, so a state is refused only for a setting that changes
the bits of a graft. Each setting's place rests on a measurement (README, "The fingerprint"):

- **must match** (in the fingerprint; a state built under another value is refused, text RAG serves it):
  the model file, llama-cpp-python's version, the CPU features it was built with (llamafile included), ggml's
  tiled K-quant matmul (``GGML_CPU_TILED_MM``: on Gemma 3 it moved batch logits by up to 4.4), the
  architecture and device, ``n_batch`` and ``n_ubatch`` (the prefill chunking), ``type_k``/``type_v``,
  ``flash_attn``, ``swa_full``, ``repack`` (another matmul kernel), ``n_gpu_layers``, the prefix template and
  the state format;
- **measured harmless** (left out): ``n_threads`` (the KV bytes a multi-token prefill writes, and its
  logits, were bitwise equal at 1, 2, 4 and 8 threads on both bundled models, once no prefill chunk is a
  single token: see `PREFILL_CHUNKING`) and ``n_ctx`` (a larger context restores and continues a state
  bitwise equal to text RAG in it).
"""

from __future__ import annotations

from dataclasses import fields

from ._config import LlamaConfig

__all__ = ["HARMLESS", "MUST_MATCH", "PREFILL_CHUNKING", "chunk_sizes"]

#: LlamaConfig fields left out of the fingerprint, each with the measurement that put it there.
HARMLESS: dict[str, str] = {
    "model_path": "the model is pinned by its sha256 instead",
    "n_threads": "KV bytes and prefill logits bitwise equal at 1, 2, 4, 8 threads (no 1-token chunk)",
    "n_ctx": "a state built at 4096 restores into 8192 and continues bitwise equal to text RAG there",
}

#: LlamaConfig fields that must match between build and use; an engine opened on a library takes them
#: from it unless the caller sets them.
MUST_MATCH: tuple[str, ...] = tuple(f.name for f in fields(LlamaConfig) if f.name not in HARMLESS)

#: How a prefill is cut into chunks (part of the fingerprint): ``n_batch`` tokens each, and never a last
#: chunk of one token. A one-token chunk takes llama.cpp's vector path, whose results depend on the
#: thread count (the KV bytes of prefix 1025 = 512 + 512 + 1 differed between 1, 2 and 4 threads).
PREFILL_CHUNKING = "n_batch-no-single-token-tail"


def chunk_sizes(n_tokens: int, n_batch: int) -> list[int]:
    """Chunk lengths for prefilling ``n_tokens``: ``n_batch`` each, the last two rebalanced so that no chunk
    of a multi-token prefill is a single token (``1025, 512 -> [512, 511, 2]``)."""
    sizes = [n_batch] * (n_tokens // n_batch)
    if n_tokens % n_batch:
        sizes.append(n_tokens % n_batch)
    if len(sizes) > 1 and sizes[-1] == 1:
        sizes[-2] -= 1
        sizes[-1] = 2
    return sizes
