"""Relative Frobenius quantization error ||deq(q(x)) - x|| / ||x|| on Gaussian data (docs/SPEC.md §3).

Prints MXFP8 (both scale rules), NVFP4 (per-tensor / per-token, ieee / approx division) and the
error vs block size (8..128) for both formats. Usage: python benchmarks/quant_error.py [--rows R --cols C]
"""

import argparse

import jax
import jax.numpy as jnp

from horizon.quant import formats as F
from horizon.utils import progress, provenance


def rel_err(x, deq):
    return float(jnp.linalg.norm(deq - x) / jnp.linalg.norm(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    provenance.announce(config=vars(args), seeds=args.seed)
    x = jax.random.normal(jax.random.key(args.seed), (args.rows, args.cols))
    # rows with different magnitudes make per-tensor vs per-token scaling matter
    x_het = x * jnp.exp2(jax.random.uniform(jax.random.key(args.seed + 1), (args.rows, 1), minval=-8, maxval=8))
    print(f"data: N(0,1) [{args.rows}, {args.cols}]; 'hetero' = rows scaled by 2^U(-8,8)")
    print(f"{'format':44s} {'gauss':>9s} {'hetero':>9s}")
    for rule in F.SCALE_RULES:
        e = [rel_err(d, F.dequantize_mxfp8(F.quantize_mxfp8(d, scale_rule=rule))) for d in (x, x_het)]
        print(f"{'MXFP8 E4M3/E8M0 blk32 ' + rule:44s} {e[0]:9.4e} {e[1]:9.4e}")
    for scaling in F.SCALINGS:
        for div in F.DIVISIONS:
            e = [rel_err(d, F.dequantize_nvfp4(F.quantize_nvfp4(d, scaling=scaling, division=div)))
                 for d in (x, x_het)]
            print(f"{'NVFP4 E2M1/E4M3 blk16 ' + scaling + ' ' + div:44s} {e[0]:9.4e} {e[1]:9.4e}")
    e = rel_err(x, F.dequantize_nvfp4(F.quantize_nvfp4(x, rounding="stochastic", key=jax.random.key(7))))
    print(f"{'NVFP4 per_token stochastic rounding':44s} {e:9.4e}")
    def row_err(d, deq):  # mean over rows of the per-row relative error (small rows count equally)
        return float(jnp.mean(jnp.linalg.norm(deq - d, axis=1) / jnp.linalg.norm(d, axis=1)))
    print("\nmean per-row relative error on 'hetero' (per-tensor scaling starves the small rows):")
    for scaling in F.SCALINGS:
        print(f"  NVFP4 {scaling:10s} "
              f"{row_err(x_het, F.dequantize_nvfp4(F.quantize_nvfp4(x_het, scaling=scaling))):9.4e}")
    print("\nerror vs block size (gauss):")
    print(f"{'block':>6s} {'MXFP8 rceil':>12s} {'MXFP8 floor':>12s} {'NVFP4 per_token':>16s}")
    for b in progress.progress((8, 16, 32, 64, 128), desc="error vs block size", unit="block size"):
        m_r = rel_err(x, F.dequantize_mxfp8(F.quantize_mxfp8(x, block_size=b)))
        m_f = rel_err(x, F.dequantize_mxfp8(F.quantize_mxfp8(x, scale_rule="floor", block_size=b)))
        n = rel_err(x, F.dequantize_nvfp4(F.quantize_nvfp4(x, block_size=b)))
        progress.say(f"{b:6d} {m_r:12.4e} {m_f:12.4e} {n:16.4e}")


if __name__ == "__main__":
    main()
