"""Step time and communicated bytes per mesh preset on the 8-device CPU mesh (docs/SPEC.md §2).

Run: ``.venv/bin/python benchmarks/parallel.py [--steps 5] [--presets dp8,ep8] [--seq 64]``.
Prints, per preset: compile time, mean step time of the sharded LM train step (tiny config), the
per-device bytes of each collective in the compiled HLO (scan bodies counted once), the per-device
parameter+optimizer bytes, and the loss (same for every preset). Also prints the EP block's dispatch
bytes with and without the MXFP8 payload. CPU numbers measure overheads, not GPU speed.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from horizon.model import transformer  # noqa: E402
from horizon.parallel import experts, sharded  # noqa: E402
from horizon.parallel import mesh as pmesh
from horizon.train import lm  # noqa: E402
from horizon.utils import progress, provenance  # noqa: E402
from horizon.utils.config import load_config_file  # noqa: E402


def make_batch(b, s, vocab, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (b, s)).astype(np.int32)
    seg = (np.arange(s)[None, :] >= s // 2).astype(np.int32).repeat(b, 0)
    pos = np.asarray(transformer.default_positions(jnp.asarray(tokens), jnp.asarray(seg)), np.int32)
    return dict(tokens=tokens, segment_ids=seg, positions=pos, mask=np.ones((b, s), np.float32))


def _mb(n):
    return f"{n / 2**20:8.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/tiny.py")
    ap.add_argument("--presets", default="dp8,fsdp4xcp2,ep4xcp2,ep8")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    provenance.announce(config=vars(args))
    print(f"devices: {len(jax.devices())} x {jax.devices()[0].platform}; batch {args.batch} x seq {args.seq}")
    base = load_config_file(args.config)
    state = lm.init_state(jax.random.key(0), base)
    batch = make_batch(args.batch, args.seq, base.model.vocab_size)
    cols = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
    print(f"{'preset':<10} {'compile_s':>9} {'step_ms':>8}  " + " ".join(f"{c[:14] + '_MiB':>14}" for c in cols)
          + f" {'state_MiB/dev':>13} {'loss':>8}")
    for preset in progress.progress(args.presets.split(","), desc="mesh presets", unit="preset"):
        cfg = base.copy_and_resolve_references()
        cfg.mesh.preset = preset
        mesh = pmesh.make_mesh(cfg.mesh)
        step, st_sh, b_sh = lm.make_train_step(cfg, mesh, jax.eval_shape(lambda: state))
        st, bt = jax.device_put(state, st_sh), jax.device_put(batch, b_sh)
        t0 = time.perf_counter()
        with jax.set_mesh(mesh):
            compiled = step.jitted.lower(st, bt).compile()
        t_compile = time.perf_counter() - t0
        comm = sharded.collective_bytes(compiled.as_text())
        out = compiled(st, bt)
        jax.block_until_ready(out)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            out = compiled(st, bt)
        jax.block_until_ready(out)
        dt = (time.perf_counter() - t0) / args.steps
        state_b = pmesh.bytes_per_device(state, st_sh)
        progress.say(f"{preset:<10} {t_compile:9.1f} {dt * 1e3:8.1f}  " + " ".join(f"{_mb(comm[c]):>14}" for c in cols)
                     + f" {_mb(state_b):>13} {float(out[1]['loss']):8.4f}")

    # EP dispatch payload: bytes of the all-to-alls of one MoE block, compute dtype vs MXFP8
    cfg = sharded.configure(base.copy_and_resolve_references())
    cfg.mesh.preset = "ep8"
    mesh = pmesh.make_mesh(cfg.mesh)
    p = jax.tree.map(lambda a: a[0], state.params["moe"]["moe"])
    x = jax.random.normal(jax.random.key(1), (args.batch, args.seq, base.model.d_model))
    for payload in ("compute", "mxfp8"):
        m = cfg.model.copy_and_resolve_references()
        m.ep_payload = payload
        with jax.set_mesh(mesh):
            # a default arg (m=m) would become a traced jit input
            hlo = jax.jit(lambda p, x: experts.ep_moe_block(p, x, cfg=m)[0]).lower(p, x).compile().as_text()  # noqa: B023 - traced within the iteration
        b = sharded.collective_bytes(hlo)["all-to-all"]
        print(f"EP block all-to-all bytes/device (ep8, drop-less capacity), payload={payload:<8}: {b} B")


if __name__ == "__main__":
    main()
