"""Tiny random-weight GGUF models, one per architecture, for ``kvgraft doctor --arch-matrix``.

Each is written with the ``gguf`` package: a few layers, a 64-wide residual stream, a byte-level
SentencePiece vocabulary, weights drawn from a seeded normal scaled by ``1/sqrt(fan_in)`` so activations
stay finite. They are not language models; they exercise llama.cpp's graph and cache layout for their
architecture exactly as a real checkpoint would (the cache layout depends on the architecture and the
hyperparameters, never on the weights' values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvgraft_plugin.core.exceptions import ConfigError

__all__ = ["TINY_ARCHS", "TinyArch", "write_tiny_model"]

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 2, 16, 128
N_EXPERT, N_EXPERT_USED = 4, 2
#: Sliding window of the SWA models: short, so probes run past it in a few dozen tokens.
WINDOW = 32
_BYTES = [f"<0x{b:02X}>" for b in range(256)]
_SPECIALS = ["<unk>", "<s>", "</s>", "<|end|>", "<|endoftext|>"]  # phi3's vocabulary looks up <|end|>
_PIECES = [*_SPECIALS, *_BYTES, *(f"\u2581{w}" for w in ("the", "a", "is", "of", "to", "and"))]


@dataclass(frozen=True)
class TinyArch:
    """One architecture of the matrix and what kind of cache it has."""

    name: str
    """The GGUF ``general.architecture``."""
    n_layer: int
    swa: bool = False
    moe: bool = False
    recurrent: bool = False
    hparams: dict[str, Any] = field(default_factory=dict)
    """Architecture keys (without the ``{arch}.`` prefix) beyond the common ones."""
    extra: Callable[[Any, int, np.random.Generator], None] | None = None
    """Adds the architecture's own tensors for block ``i`` (``None``: a llama-style block)."""
    hybrid: bool = False
    """Attention layers beside recurrent or convolutional ones."""
    mrope: bool = False
    """Multi-axis RoPE: each cache cell keeps extra positions."""
    output_norm: str = "output_norm"


def _w(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """A weight of numpy shape ``shape`` (GGUF's is reversed), scaled by its fan-in."""
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def _norm(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def _attention(
    writer: Any, i: int, rng: np.random.Generator, *, qk_norm: tuple[int, int] = (0, 0), bias: bool = False
) -> None:
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    writer.add_tensor(f"blk.{i}.attn_q.weight", _w(rng, q, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_k.weight", _w(rng, kv, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_v.weight", _w(rng, kv, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_output.weight", _w(rng, N_EMBD, q))
    if bias:
        for name, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            writer.add_tensor(f"blk.{i}.{name}.bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
    if qk_norm[0]:
        writer.add_tensor(f"blk.{i}.attn_q_norm.weight", _norm(qk_norm[0]))
        writer.add_tensor(f"blk.{i}.attn_k_norm.weight", _norm(qk_norm[1]))


def _mlp(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.ffn_gate.weight", _w(rng, N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_up.weight", _w(rng, N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_down.weight", _w(rng, N_EMBD, N_FF))


def _experts(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", _w(rng, N_EXPERT, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_gate_exps.weight", _w(rng, N_EXPERT, N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_up_exps.weight", _w(rng, N_EXPERT, N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_down_exps.weight", _w(rng, N_EXPERT, N_EMBD, N_FF))


def _llama_block(writer: Any, i: int, rng: np.random.Generator, **attention: Any) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    _attention(writer, i, rng, **attention)
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", _norm(N_EMBD))
    _mlp(writer, i, rng)


def _qwen2(writer: Any, i: int, rng: np.random.Generator) -> None:
    _llama_block(writer, i, rng, bias=True)


def _qwen3(writer: Any, i: int, rng: np.random.Generator) -> None:
    _llama_block(writer, i, rng, qk_norm=(HEAD_DIM, HEAD_DIM))


def _phi3(writer: Any, i: int, rng: np.random.Generator) -> None:
    qkv = N_HEAD * HEAD_DIM + 2 * N_HEAD_KV * HEAD_DIM
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_qkv.weight", _w(rng, qkv, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_output.weight", _w(rng, N_EMBD, N_HEAD * HEAD_DIM))
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", _norm(N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_up.weight", _w(rng, 2 * N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_down.weight", _w(rng, N_EMBD, N_FF))


def _olmo2(writer: Any, i: int, rng: np.random.Generator) -> None:
    _attention(writer, i, rng, qk_norm=(N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM))
    writer.add_tensor(f"blk.{i}.post_attention_norm.weight", _norm(N_EMBD))
    _mlp(writer, i, rng)
    writer.add_tensor(f"blk.{i}.post_ffw_norm.weight", _norm(N_EMBD))


def _gemma(qk_norm: int) -> Callable[[Any, int, np.random.Generator], None]:
    def block(writer: Any, i: int, rng: np.random.Generator) -> None:
        writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
        _attention(writer, i, rng, qk_norm=(qk_norm, qk_norm))
        writer.add_tensor(f"blk.{i}.post_attention_norm.weight", _norm(N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", _norm(N_EMBD))
        _mlp(writer, i, rng)
        writer.add_tensor(f"blk.{i}.post_ffw_norm.weight", _norm(N_EMBD))

    return block


def _mixtral(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    _attention(writer, i, rng)
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", _norm(N_EMBD))
    _experts(writer, i, rng)


def _qwen2moe(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    _attention(writer, i, rng, bias=True)
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", _norm(N_EMBD))
    _experts(writer, i, rng)
    _shared_expert(writer, i, rng)


def _shared_expert(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.ffn_gate_inp_shexp.weight", _w(rng, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_gate_shexp.weight", _w(rng, N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_up_shexp.weight", _w(rng, N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_down_shexp.weight", _w(rng, N_EMBD, N_FF))


D_INNER, D_STATE, D_CONV, DT_RANK = 2 * N_EMBD, 16, 4, 4


def _mamba(writer: Any, i: int, rng: np.random.Generator, *, norm: bool = True) -> None:
    if norm:
        writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    writer.add_tensor(f"blk.{i}.ssm_in.weight", _w(rng, 2 * D_INNER, N_EMBD))
    writer.add_tensor(f"blk.{i}.ssm_conv1d.weight", _w(rng, D_INNER, D_CONV))
    writer.add_tensor(f"blk.{i}.ssm_conv1d.bias", np.zeros(D_INNER, dtype=np.float32))
    writer.add_tensor(f"blk.{i}.ssm_x.weight", _w(rng, DT_RANK + 2 * D_STATE, D_INNER))
    writer.add_tensor(f"blk.{i}.ssm_dt.weight", _w(rng, D_INNER, DT_RANK))
    writer.add_tensor(f"blk.{i}.ssm_dt.bias", np.full(D_INNER, -2.0, dtype=np.float32))
    a = -np.tile(np.arange(1, D_STATE + 1, dtype=np.float32), (D_INNER, 1))
    writer.add_tensor(f"blk.{i}.ssm_a", a)
    writer.add_tensor(f"blk.{i}.ssm_d", np.ones(D_INNER, dtype=np.float32))
    writer.add_tensor(f"blk.{i}.ssm_out.weight", _w(rng, N_EMBD, D_INNER))


#: Hybrid layer pattern: which blocks are attention (the others recurrent or convolutional).
HYBRID_ATTENTION = (1,)
N_HYBRID = 3
L_CACHE = 3


def _hybrid_kv() -> list[int]:
    """Per-layer KV head counts of a hybrid: 0 marks a recurrent layer."""
    return [N_HEAD_KV if i in HYBRID_ATTENTION else 0 for i in range(N_HYBRID)]


def _lfm2(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    if i in HYBRID_ATTENTION:
        _attention(writer, i, rng, qk_norm=(HEAD_DIM, HEAD_DIM))
    else:
        writer.add_tensor(f"blk.{i}.shortconv.conv.weight", _w(rng, N_EMBD, L_CACHE))
        writer.add_tensor(f"blk.{i}.shortconv.in_proj.weight", _w(rng, 3 * N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.shortconv.out_proj.weight", _w(rng, N_EMBD, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", _norm(N_EMBD))
    _mlp(writer, i, rng)


N_SSM_HEAD, N_GROUP = 8, 1
_CONV_DIM = D_INNER + 2 * N_GROUP * D_STATE


def _mamba2_mixer(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.ssm_in.weight", _w(rng, 2 * D_INNER + 2 * N_GROUP * D_STATE + N_SSM_HEAD, N_EMBD))
    writer.add_tensor(f"blk.{i}.ssm_conv1d.weight", _w(rng, _CONV_DIM, D_CONV))
    writer.add_tensor(f"blk.{i}.ssm_conv1d.bias", np.zeros(_CONV_DIM, dtype=np.float32))
    writer.add_tensor(f"blk.{i}.ssm_dt.bias", np.full(N_SSM_HEAD, -2.0, dtype=np.float32))
    writer.add_tensor(f"blk.{i}.ssm_a", -np.arange(1, N_SSM_HEAD + 1, dtype=np.float32).reshape(N_SSM_HEAD, 1))
    writer.add_tensor(f"blk.{i}.ssm_d", np.ones((N_SSM_HEAD, 1), dtype=np.float32))
    writer.add_tensor(f"blk.{i}.ssm_norm.weight", np.ones((N_GROUP, D_INNER // N_GROUP), dtype=np.float32))
    writer.add_tensor(f"blk.{i}.ssm_out.weight", _w(rng, N_EMBD, D_INNER))


def _mamba2(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    _mamba2_mixer(writer, i, rng)


def _granite_hybrid(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    if i in HYBRID_ATTENTION:
        _attention(writer, i, rng)
    else:
        _mamba2_mixer(writer, i, rng)
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", _norm(N_EMBD))
    _mlp(writer, i, rng)


#: Nemotron-H's blocks each hold one mixer: Mamba-2, attention, or an MLP (ReLU², no gate).
NEMOTRON_PATTERN = ("mamba", "attention", "mlp")


def _nemotron_h(writer: Any, i: int, rng: np.random.Generator) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    kind = NEMOTRON_PATTERN[i]
    if kind == "mamba":
        _mamba2_mixer(writer, i, rng)
    elif kind == "attention":
        _attention(writer, i, rng)
    else:
        writer.add_tensor(f"blk.{i}.ffn_up.weight", _w(rng, N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", _w(rng, N_EMBD, N_FF))


def _falcon_h1(writer: Any, i: int, rng: np.random.Generator) -> None:
    """Falcon-H1 runs attention and a Mamba-2 mixer side by side in every block."""
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    _mamba2_mixer(writer, i, rng)
    _attention(writer, i, rng)
    writer.add_tensor(f"blk.{i}.ffn_norm", _norm(N_EMBD))
    _mlp(writer, i, rng)


def _jamba(writer: Any, i: int, rng: np.random.Generator) -> None:
    """Mamba-1 blocks beside an attention block, whose feed-forward is a mixture of experts."""
    writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
    if i in HYBRID_ATTENTION:
        _attention(writer, i, rng)
    else:
        _mamba(writer, i, rng, norm=False)
        writer.add_tensor(f"blk.{i}.ssm_dt_norm.weight", _norm(DT_RANK))
        writer.add_tensor(f"blk.{i}.ssm_b_norm.weight", _norm(D_STATE))
        writer.add_tensor(f"blk.{i}.ssm_c_norm.weight", _norm(D_STATE))
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", _norm(N_EMBD))
    (_experts if i in HYBRID_ATTENTION else _mlp)(writer, i, rng)


#: Gated DeltaNet (Qwen3.5, Qwen3-Next): key heads, value heads, and the width of each.
N_K_HEADS, N_V_HEADS, DELTA_HEAD = 2, 4, 16


def _gated_delta_net(writer: Any, i: int, rng: np.random.Generator, *, fused_ba: bool) -> None:
    key_dim, value_dim = DELTA_HEAD * N_K_HEADS, DELTA_HEAD * N_V_HEADS
    writer.add_tensor(f"blk.{i}.attn_qkv.weight", _w(rng, 2 * key_dim + value_dim, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_gate.weight", _w(rng, value_dim, N_EMBD))
    writer.add_tensor(f"blk.{i}.ssm_conv1d.weight", _w(rng, 2 * key_dim + value_dim, D_CONV))
    writer.add_tensor(f"blk.{i}.ssm_dt.bias", np.zeros(N_V_HEADS, dtype=np.float32))
    writer.add_tensor(f"blk.{i}.ssm_a", -np.ones(N_V_HEADS, dtype=np.float32))
    if fused_ba:
        writer.add_tensor(f"blk.{i}.ssm_ba.weight", _w(rng, 2 * N_V_HEADS, N_EMBD))
    else:
        writer.add_tensor(f"blk.{i}.ssm_beta.weight", _w(rng, N_V_HEADS, N_EMBD))
        writer.add_tensor(f"blk.{i}.ssm_alpha.weight", _w(rng, N_V_HEADS, N_EMBD))
    writer.add_tensor(f"blk.{i}.ssm_norm.weight", _norm(DELTA_HEAD))
    writer.add_tensor(f"blk.{i}.ssm_out.weight", _w(rng, N_EMBD, value_dim))


def _gated_attention(writer: Any, i: int, rng: np.random.Generator) -> None:
    """Qwen3.5's full-attention layer: a gated query (twice as wide), QK norms."""
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    writer.add_tensor(f"blk.{i}.attn_q.weight", _w(rng, 2 * q, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_k.weight", _w(rng, kv, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_v.weight", _w(rng, kv, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_output.weight", _w(rng, N_EMBD, q))
    writer.add_tensor(f"blk.{i}.attn_q_norm.weight", _norm(HEAD_DIM))
    writer.add_tensor(f"blk.{i}.attn_k_norm.weight", _norm(HEAD_DIM))


def _qwen35(moe: bool) -> Callable[[Any, int, np.random.Generator], None]:
    def block(writer: Any, i: int, rng: np.random.Generator) -> None:
        writer.add_tensor(f"blk.{i}.attn_norm.weight", _norm(N_EMBD))
        writer.add_tensor(f"blk.{i}.post_attention_norm.weight", _norm(N_EMBD))
        if i in HYBRID_ATTENTION:
            _gated_attention(writer, i, rng)
        else:
            _gated_delta_net(writer, i, rng, fused_ba=moe)
        if moe:
            _experts(writer, i, rng)
            _shared_expert(writer, i, rng)
        else:
            _mlp(writer, i, rng)

    return block


_MAMBA2 = {
    "ssm.conv_kernel": D_CONV,
    "ssm.inner_size": D_INNER,
    "ssm.state_size": D_STATE,
    "ssm.time_step_rank": N_SSM_HEAD,
    "ssm.group_count": N_GROUP,
}
_SWA = {"attention.sliding_window": WINDOW}
#: M-RoPE's sections (temporal, height, width, unused) of a head's rotary pairs.
_MROPE = {"rope.dimension_sections": [2, 2, 4, 0]}
_DELTA = {
    **_MROPE,
    "full_attention_interval": 2,
    "ssm.conv_kernel": D_CONV,
    "ssm.inner_size": DELTA_HEAD * N_V_HEADS,
    "ssm.state_size": DELTA_HEAD,
    "ssm.time_step_rank": N_V_HEADS,
    "ssm.group_count": N_K_HEADS,
}
_MOE = {"expert_count": N_EXPERT, "expert_used_count": N_EXPERT_USED}
_GEMMA = {"attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM}

#: The matrix: dense, sliding-window, mixture-of-experts and recurrent models that llama.cpp loads.
TINY_ARCHS: dict[str, TinyArch] = {
    arch.name if arch.name != "llama" or not arch.moe else "llama-moe": arch
    for arch in (
        TinyArch("llama", 2),
        TinyArch("qwen2", 2, extra=_qwen2),
        TinyArch("qwen3", 2, extra=_qwen3),
        TinyArch("olmo2", 2, extra=_olmo2),
        TinyArch(
            "granite",
            2,
            hparams={"attention.scale": 0.25, "embedding_scale": 2.0, "residual_scale": 0.5, "logit_scale": 4.0},
        ),  # fmt: skip
        TinyArch("phi3", 2, hparams={"rope.dimension_count": HEAD_DIM}, extra=_phi3),
        TinyArch(
            "gemma2",
            2,
            swa=True,
            hparams={**_SWA, **_GEMMA, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
            extra=_gemma(0),
        ),  # fmt: skip
        TinyArch("gemma3", 6, swa=True, hparams={**_SWA, **_GEMMA}, extra=_gemma(HEAD_DIM)),
        TinyArch("llama", 2, moe=True, hparams=_MOE, extra=_mixtral),
        TinyArch(
            "qwen2moe",
            2,
            moe=True,
            extra=_qwen2moe,
            hparams={**_MOE, "expert_feed_forward_length": N_FF, "expert_shared_feed_forward_length": N_FF},
        ),
        TinyArch(
            "mamba",
            2,
            recurrent=True,
            extra=_mamba,
            hparams={
                "ssm.conv_kernel": D_CONV,
                "ssm.inner_size": D_INNER,
                "ssm.state_size": D_STATE,
                "ssm.time_step_rank": DT_RANK,
            },
        ),  # fmt: skip
        TinyArch(
            "lfm2",
            N_HYBRID,
            hybrid=True,
            extra=_lfm2,
            output_norm="token_embd_norm",
            hparams={"attention.head_count_kv": _hybrid_kv(), "shortconv.l_cache": L_CACHE},
        ),
        TinyArch("mamba2", 2, recurrent=True, extra=_mamba2, hparams=_MAMBA2),
        TinyArch(
            "granitehybrid",
            N_HYBRID,
            hybrid=True,
            extra=_granite_hybrid,
            hparams={**_MAMBA2, "attention.head_count_kv": _hybrid_kv()},
        ),
        TinyArch(
            "nemotron_h",
            len(NEMOTRON_PATTERN),
            hybrid=True,
            extra=_nemotron_h,
            hparams={
                **_MAMBA2,
                "attention.layer_norm_epsilon": 1e-5,
                "attention.head_count_kv": [N_HEAD_KV if k == "attention" else 0 for k in NEMOTRON_PATTERN],
                "feed_forward_length": [N_FF if k == "mlp" else 0 for k in NEMOTRON_PATTERN],
            },
        ),
        TinyArch("falcon-h1", 2, hybrid=True, extra=_falcon_h1, hparams=_MAMBA2),
        TinyArch(
            "jamba",
            N_HYBRID,
            hybrid=True,
            moe=True,
            extra=_jamba,
            hparams={
                **_MOE,
                "attention.head_count_kv": _hybrid_kv(),
                "ssm.conv_kernel": D_CONV,
                "ssm.inner_size": D_INNER,
                "ssm.state_size": D_STATE,
                "ssm.time_step_rank": DT_RANK,
            },
        ),
        TinyArch("qwen35", N_HYBRID, hybrid=True, mrope=True, extra=_qwen35(False), hparams=_DELTA),
        TinyArch(
            "qwen3next",
            N_HYBRID,
            hybrid=True,
            moe=True,
            extra=_qwen35(True),
            hparams={
                **_DELTA,
                **_MOE,
                "expert_feed_forward_length": N_FF,
                "expert_shared_feed_forward_length": N_FF,
            },
        ),
        TinyArch("qwen2vl", 2, mrope=True, hparams=_MROPE, extra=_qwen2),
        TinyArch("qwen3vl", 2, mrope=True, hparams=_MROPE, extra=_qwen3),
    )
}


def _add_key(writer: Any, key: str, value: Any) -> None:
    """One metadata key, typed as llama.cpp reads it: u32 integers, f32 floats, arrays of either."""
    if isinstance(value, list):
        writer.add_array(key, value)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    else:
        writer.add_uint32(key, value)


def write_tiny_model(path: str | Path, name: str, *, seed: int = 0) -> Path:
    """Write the tiny model ``name`` (a key of `TINY_ARCHS`) to ``path``; the same seed
    writes the same file."""
    try:
        import gguf
    except ImportError as exc:
        raise ConfigError("the architecture matrix writes GGUF files: pip install 'kvgraft-plugin[matrix]'") from exc
    spec = TINY_ARCHS.get(name)
    if spec is None:
        raise ConfigError(f"no tiny model for {name!r}: one of {', '.join(TINY_ARCHS)}")
    arch, rng = spec.name, np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"kvgraft tiny {name}")
    common: dict[str, Any] = {
        "context_length": 4096,
        "embedding_length": N_EMBD,
        "block_count": spec.n_layer,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "feed_forward_length": 0 if spec.recurrent else N_FF,
        "attention.head_count": 0 if spec.recurrent else N_HEAD,
    }
    if not spec.recurrent:
        common |= {"attention.head_count_kv": N_HEAD_KV, "rope.freq_base": 10000.0}
    for key, value in {**common, **spec.hparams}.items():
        _add_key(writer, f"{arch}.{key}", value)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(_PIECES)
    n_words = len(_PIECES) - len(_SPECIALS) - 256
    writer.add_token_scores([0.0] * (len(_SPECIALS) + 256) + [-1.0] * n_words)
    writer.add_token_types([2] + [3] * (len(_SPECIALS) - 1) + [6] * 256 + [1] * n_words)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    n_vocab = len(_PIECES)
    writer.add_tensor("token_embd.weight", _w(rng, n_vocab, N_EMBD))
    for i in range(spec.n_layer):
        (spec.extra or _llama_block)(writer, i, rng)
    writer.add_tensor(f"{spec.output_norm}.weight", _norm(N_EMBD))
    if spec.name != "gemma2":  # gemma2 always ties its output to the embedding
        writer.add_tensor("output.weight", _w(rng, n_vocab, N_EMBD))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
