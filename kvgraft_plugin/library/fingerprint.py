"""What a saved state's bits depend on: the settings that must match, and those measured harmless.

A library is built once and used on many machines, so a state is refused only for a setting that changes
the bits of a graft. Each setting's place rests on a measurement (docs/exactness.md, "The fingerprint"):

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

import logging
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from kvgraft_plugin.core.config import LlamaConfig
from kvgraft_plugin.core.exceptions import ConfigError
from kvgraft_plugin.core.statefile import FORMAT_VERSION

__all__ = [
    "HARMLESS",
    "MUST_MATCH",
    "PREFILL_CHUNKING",
    "RUNTIME_FACTS",
    "adopt_pinned",
    "chunk_sizes",
    "make_fingerprint",
]

logger = logging.getLogger(__name__)

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


#: What the backend reports about itself (`Backend.runtime_facts`) that changes the bits: the runtime's
#: version, the CPU features it was built with, ggml's tiled matmul, the architecture and the device.
RUNTIME_FACTS: tuple[str, ...] = ("llama_cpp_python", "system_info", "tiled_matmul", "arch", "device")


def make_fingerprint(
    *, template: str, gguf_sha256: str, runtime: Mapping[str, Any], llama: LlamaConfig
) -> dict[str, Any]:
    """Everything that changes the KV bytes, their layout, or how later tokens are computed; settings
    measured harmless (`HARMLESS`) are left out. ``runtime`` is the backend's `RUNTIME_FACTS`."""
    missing = [name for name in RUNTIME_FACTS if name not in runtime]
    if missing:
        raise ValueError(f"the backend did not report {missing}")
    return {
        "format": FORMAT_VERSION,
        "template": template,
        "gguf_sha256": gguf_sha256,
        **{name: runtime[name] for name in RUNTIME_FACTS},
        "prefill_chunking": PREFILL_CHUNKING,
        **{name: getattr(llama, name) for name in MUST_MATCH},
        "n_seq_max": 1,
    }


def adopt_pinned(llama: LlamaConfig, pinned: Mapping[str, Any], explicit: Mapping[str, Any]) -> LlamaConfig:
    """``llama`` with a library's must-match settings (its fingerprint, ``pinned``) wherever the caller did
    not set one (``explicit``: the settings the caller passed); a setting the caller set to another value is
    reported once (its states will then be served by text RAG)."""
    adopted: dict[str, Any] = {}
    for name in MUST_MATCH:
        if name not in pinned or name == "model_path":
            continue
        if explicit.get(name) is None:
            adopted[name] = pinned[name]
        elif explicit[name] != pinned[name]:
            logger.warning(
                "%s=%r differs from the library's %r: its states will not be grafted (text RAG serves them)",
                name,
                explicit[name],
                pinned[name],
            )
    try:
        return llama.replace(**adopted)
    except (ConfigError, TypeError) as exc:  # a damaged manifest: its states will be refused as incompatible
        logger.warning("the library's pinned settings cannot be used (%s); keeping this engine's", exc)
        return llama


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
