"""Independent numpy / ml_dtypes oracles for the quantizers (written from the rules, not the code).

MX: float64 math; exponent = the smallest integer e with amax <= 448 * 2^e (rceil), or
floor(log2 amax) - 8 (floor), found with math.log2 plus exact power-of-two fix-ups; elements
cast by ml_dtypes. NVFP4: the TE rule step by step in numpy float32, casts by ml_dtypes.
"""

import math

import ml_dtypes
import numpy as np


def mx_exponent(amax: float, rule: str) -> int:
    if amax == 0:
        return -127
    if rule == "floor":
        e = math.floor(math.log2(amax))
        while 2.0 ** e > amax:
            e -= 1
        while 2.0 ** (e + 1) <= amax:
            e += 1
        e -= 8
    else:
        e = math.ceil(math.log2(amax / 448.0))
        while amax > 448.0 * 2.0 ** e:
            e += 1
        while amax <= 448.0 * 2.0 ** (e - 1):
            e -= 1
    return max(-127, min(127, e))


def quantize_mx(x: np.ndarray, rule: str = "rceil", block: int = 32):
    """-> (e4m3 bytes [..., K], e8m0 bytes [..., K//block])."""
    x = np.asarray(x, np.float64)
    xb = x.reshape(-1, block)
    vals = np.zeros(xb.shape, ml_dtypes.float8_e4m3fn)
    sc = np.zeros(xb.shape[0], np.uint8)
    for i, blk in enumerate(xb):
        if not np.all(np.isfinite(blk)):
            sc[i] = 255
            vals[i] = np.nan
            continue
        e = mx_exponent(float(np.max(np.abs(blk))), rule)
        sc[i] = e + 127
        vals[i] = np.clip(blk / 2.0 ** e, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return vals.view(np.uint8).reshape(x.shape), sc.reshape(*x.shape[:-1], x.shape[-1] // block)


def quantize_nvfp4_per_tensor(x: np.ndarray, block: int = 16):
    """-> (e2m1 codes as float32 values [..., K], e4m3 bytes [..., K//16], global decode scale)."""
    f = np.float32
    x = np.asarray(x, np.float32)
    A = f(np.max(np.abs(x)))
    S = f(1.0) if A == 0 else f(f(2688.0) / A)
    xb = x.reshape(-1, block)
    bam = np.max(np.abs(xb), axis=1).astype(np.float32)
    sb = np.minimum((bam / f(6.0)).astype(np.float32) * S, f(448.0)).astype(np.float32)
    sb8 = sb.astype(ml_dtypes.float8_e4m3fn)
    sbf = sb8.astype(np.float32)
    denom = (sbf / S).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(sbf[:, None] == 0, f(0), xb / denom[:, None]).astype(np.float32)
    q = np.clip(y, -6, 6).astype(ml_dtypes.float4_e2m1fn)
    return (q.astype(np.float32).reshape(x.shape), sb8.view(np.uint8).reshape(*x.shape[:-1], -1),
            f(f(1.0) / S))


def dequant_mx(vals_u8: np.ndarray, sc_u8: np.ndarray, block: int = 32) -> np.ndarray:
    v = vals_u8.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    s = np.where(sc_u8 == 255, np.nan, 2.0 ** (sc_u8.astype(np.float64) - 127))
    return (v.reshape(*s.shape, block) * s[..., None]).reshape(v.shape)
