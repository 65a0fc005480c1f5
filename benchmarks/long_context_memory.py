"""XLA's memory of the LM and the RL train step at long context, per row (docs/SPEC.md §1.4).

For each `--seq` (default 2k, 8k, 32k tokens) it compiles, from abstract shapes (nothing is
allocated), the LM train step (`horizon.train.lm.make_train_step`, what experiments/pretrain.py
and the SFT stages run) and the RL train step (`horizon.rl.algo.trainer.compile_train_step`, the
one `rl.memory_check` measures), both on one row of `--seq` tokens, and prints XLA's accounting
(`Compiled.memory_analysis()`: temporaries, arguments, outputs) with the growth of the
temporaries from one length to the next (a path whose memory is linear in the context grows ~4x
from 2k to 8k; one that materializes [seq, seq] scores grows ~16x).

    .venv/bin/python benchmarks/long_context_memory.py                       # configs/small.py, 2 layers, f32
    .venv/bin/python benchmarks/long_context_memory.py --seq 2048 8192 --layers 2 --rl-config configs/rl_tiny.py

The model is `--config`'s with `--layers` layers (first dense, the rest MoE), f32, its
`max_seq_len` raised to the longest `--seq`; the RL step uses `--rl-config`'s `rl` block on that
model with no micro-batching (`rl.batch.micro_rows = 0`) and no remat unless `--remat`. `--head-chunk`
sets `model.head_chunk` (0: the full [seq, vocab] logits; `horizon.model.head`).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import ml_collections

from horizon.parallel import mesh as pmesh
from horizon.rl.runtime import memory as rlmemory
from horizon.train import lm
from horizon.utils import progress, provenance
from horizon.utils.config import load_config_file
from horizon.utils.progress import say

GIB = 2 ** 30


def model_config(path: str, layers: int, seq: int, remat: bool, head_chunk: int | None = None
                 ) -> ml_collections.ConfigDict:
    c = load_config_file(path)
    if head_chunk is not None:
        c.model.head_chunk = int(head_chunk)
    c.model.num_layers = int(layers)
    c.model.first_k_dense = min(int(c.model.first_k_dense), int(layers))
    c.model.max_seq_len = max(int(seq), int(c.model.max_seq_len))
    c.model.dtype = c.model.param_dtype = "float32"
    c.model.remat = bool(remat)
    return c


def lm_memory(c, seq: int):
    """`memory_analysis()` of the LM train step on a [1, seq] batch."""
    state = jax.eval_shape(lambda: lm.init_state(jax.random.key_data(jax.random.key(0)), c))
    step, _, _ = lm.make_train_step(c, pmesh.mesh_from_config(c), state)
    batch = {k: jax.ShapeDtypeStruct((1, seq), "float32" if k == "mask" else "int32")
             for k in ("tokens", "segment_ids", "positions", "mask")}
    return step.lower(state, batch).compile().memory_analysis()


def rl_memory(rl_path: str, model: ml_collections.ConfigDict, seq: int):
    """`memory_analysis()` of the RL train step on one chain of one `seq`-token segment."""
    c = load_config_file(rl_path)
    c.model = model
    c.rl.batch.update(dict(micro_rows=0, min_rows=1, min_seq=seq, min_groups=1))
    shape = rlmemory.step_shape(c, chains=1, segments_per_chain=1, seq=seq, groups=1)
    return rlmemory.step_memory(c, shape)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/small.py", help="the model's config")
    ap.add_argument("--rl-config", default="configs/rl_tiny.py", help="the RL block's config")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--remat", action="store_true")
    ap.add_argument("--skip-rl", action="store_true")
    ap.add_argument("--head-chunk", type=int, default=None,
                    help="model.head_chunk (tokens per LM-head chunk; 0 = full logits); default: the config's")
    args = ap.parse_args(argv)
    provenance.announce(config=vars(args))
    head_chunk = model_config(args.config, args.layers, 1, False, args.head_chunk).model.get("head_chunk", 0)
    say(f"{args.config} with {args.layers} layers, f32, head_chunk={head_chunk}, one row per step; "
        "XLA memory_analysis (GiB)")
    say(f"{'step':>4} {'seq':>7} {'temp':>9} {'args':>8} {'out':>8} {'temp growth':>12} {'compile_s':>10}")
    prev: dict = {}
    for seq in progress.progress(sorted(args.seq), desc="sequence lengths", unit="length"):
        c = model_config(args.config, args.layers, seq, args.remat, args.head_chunk)
        for kind in ("lm",) if args.skip_rl else ("lm", "rl"):
            t0 = time.time()
            if kind == "lm":
                m = lm_memory(c, seq)
                temp, arg, out = m.temp_size_in_bytes, m.argument_size_in_bytes, m.output_size_in_bytes
            else:
                m = rl_memory(args.rl_config, c.model, seq)
                temp, arg, out = m.temp, m.args, m.out
            growth = f"{temp / prev[kind][1]:.2f}x /{seq // prev[kind][0]}x" if kind in prev else "-"
            prev[kind] = (seq, temp)
            say(f"{kind:>4} {seq:>7} {temp / GIB:>9.3f} {arg / GIB:>8.3f} {out / GIB:>8.3f} {growth:>12} "
                f"{time.time() - t0:>10.1f}")
            say(json.dumps(dict(kind=kind, seq=seq, temp_bytes=int(temp), arg_bytes=int(arg), out_bytes=int(out))))


if __name__ == "__main__":
    main()
