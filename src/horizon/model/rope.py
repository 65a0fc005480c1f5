"""Rotary position embeddings with optional YaRN scaling, as DeepSeek-V3 uses them (docs/SPEC.md §1).

Math. For a rope head dimension ``d`` (``cfg.qk_rope_head_dim``, even) and base ``theta``, pair ``i``
(``i = 0 .. d/2-1``) rotates the interleaved pair ``(x[2i], x[2i+1])`` by the angle ``p * w_i`` at
position ``p``, with ``w_i = theta^(-2i/d)``::

    x'[2i]   = a * (x[2i] cos(p w_i) - x[2i+1] sin(p w_i))
    x'[2i+1] = a * (x[2i+1] cos(p w_i) + x[2i] sin(p w_i))

``a`` is the YaRN "attention factor" (1 without scaling). Hugging Face's DeepseekV3 with
``rope_interleave=True`` rotates the same pairs but writes the outputs de-interleaved
(``[evens | odds]``); since the same permutation is applied to q and k, attention scores are identical.

YaRN (``cfg.rope_scaling.type == "yarn"``), exactly as ``transformers``' ``_compute_yarn_parameters``:
  * ``w_i^extra = theta^(-2i/d)``, ``w_i^inter = w_i^extra / factor``;
  * correction range ``[low, high]`` from ``dim(r) = d * ln(L_orig / (2 pi r)) / (2 ln theta)``:
    ``low = max(floor(dim(beta_fast)), 0)``, ``high = min(ceil(dim(beta_slow)), d-1)``;
  * ramp ``g_i = clip((i - low) / (high - low), 0, 1)`` (``high += 0.001`` if equal);
    ``w_i = w_i^inter * g_i + w_i^extra * (1 - g_i)`` (fast-rotating pairs keep their frequency);
  * ``a = m(factor, mscale) / m(factor, mscale_all_dim)`` if both ``mscale`` and ``mscale_all_dim`` are
    non-zero, else ``m(factor)``, where ``m(s, c) = 0.1 c ln(s) + 1`` (1 when ``s <= 1``);
  * DeepseekV3Attention additionally multiplies the softmax scale ``1/sqrt(d_nope + d_rope)`` by
    ``m(factor, mscale_all_dim)^2`` when ``mscale_all_dim`` is non-zero (`softmax_scale`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

ROPE_TYPES = ("none", "yarn")


class RopeTables(NamedTuple):
    """Static RoPE constants: per-pair inverse frequencies and the cos/sin multiplier."""

    inv_freq: np.ndarray  # float32 [d_rope // 2]
    attention_factor: float


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 for ``scale <= 1``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _rope_type(cfg) -> str:
    t = cfg.rope_scaling.type if "rope_scaling" in cfg else "none"
    if t not in ROPE_TYPES:
        raise ValueError(f"rope_scaling.type must be one of {ROPE_TYPES}, got {t!r}")
    return t


def rope_tables(cfg) -> RopeTables:
    """Inverse frequencies and attention factor for `cfg` (model config), computed like HF (float32)."""
    d = int(cfg.qk_rope_head_dim)
    if d <= 0 or d % 2:
        raise ValueError(f"qk_rope_head_dim must be positive and even, got {d}")
    base = float(cfg.rope_theta)
    pos_freqs = np.float32(base) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    inv_freq_extra = (1.0 / pos_freqs).astype(np.float32)
    if _rope_type(cfg) == "none":
        return RopeTables(inv_freq_extra, 1.0)

    rs = cfg.rope_scaling
    factor = float(rs.factor)
    if factor < 1.0:
        raise ValueError(f"yarn rope_scaling.factor must be >= 1, got {factor}")
    mscale, mscale_all_dim = float(rs.mscale), float(rs.mscale_all_dim)
    if mscale and mscale_all_dim:
        attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    else:
        attention_factor = yarn_get_mscale(factor)
    beta_fast = float(rs.beta_fast) or 32.0  # HF: `get("beta_fast") or 32`
    beta_slow = float(rs.beta_slow) or 1.0
    orig = float(rs.original_max_position_embeddings)

    def correction_dim(num_rotations: float) -> float:
        return (d * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    extra_factor = (1 - ramp).astype(np.float32)
    inv_freq_inter = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    inv_freq = inv_freq_inter * (1 - extra_factor) + inv_freq_extra * extra_factor
    return RopeTables(inv_freq.astype(np.float32), float(attention_factor))


def softmax_scale(cfg) -> float:
    """MLA softmax scale: ``(d_nope + d_rope)^-0.5``, times ``mscale(factor, mscale_all_dim)^2`` under YaRN."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    if _rope_type(cfg) == "yarn":
        mscale_all_dim = float(cfg.rope_scaling.mscale_all_dim)
        if mscale_all_dim:
            m = yarn_get_mscale(float(cfg.rope_scaling.factor), mscale_all_dim)
            scale = scale * m * m
    return float(scale)


def apply_rope(
    x: Float[Array, "batch seq *heads rope"],
    positions: Int[Array, "batch seq"],
    tables: RopeTables,
) -> Float[Array, "batch seq *heads rope"]:
    """Rotate interleaved pairs of `x` by ``positions * inv_freq``; cos/sin carry the attention factor.

    `x` is ``[b, s, d]`` (shared rope key) or ``[b, s, h, d]`` (per-head query). cos/sin are built in
    float32 and cast to x's dtype, as HF does.
    """
    if x.shape[-1] != 2 * tables.inv_freq.shape[0]:
        raise ValueError(f"rope dim {x.shape[-1]} != 2 * {tables.inv_freq.shape[0]}")
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(tables.inv_freq)  # [b, s, d/2]
    cos = (jnp.cos(ang) * tables.attention_factor).astype(x.dtype)
    sin = (jnp.sin(ang) * tables.attention_factor).astype(x.dtype)
    for _ in range(x.ndim - 3):  # broadcast over the head axis
        cos, sin = cos[..., None, :], sin[..., None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.reshape(x.shape)
