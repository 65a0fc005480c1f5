"""Memory of the jitted RL trainer step for a chain batch of `--rows` x `--seq` tokens (docs/SPEC.md §4).

XLA's own accounting of the compiled step (`Compiled.memory_analysis()`: temporaries, arguments,
outputs) for an experiment config, with `model.remat` off and on, on the whole batch and with
gradient accumulation over micro-batches of each `--micro-rows` rows (`rl.batch.micro_rows`);
nothing is allocated unless `--run` also times one step per setting. Why: experiments/selfsum.py's
RL died at a 27 GB allocation on a 23 GB machine once its chain batch passed 64 rows (bucket
128 x 1024).

    .venv/bin/python benchmarks/rl_step_memory.py --config=configs/selfsum_tiny.py --rows 128 --seq 1024 \
        --micro-rows 32
    .venv/bin/python benchmarks/rl_step_memory.py --config=configs/rl_swegen.py --rows 0 --micro-rows 8 4 2
    .venv/bin/python benchmarks/rl_step_memory.py --config=configs/rl_swegen.py --check \
        --config.model.max_seq_len=16384 --config.agent.max_context_tokens=16000 \
        --config.agent.trigger_tokens=15900 --config.rl.batch.micro_rows=0 --config.model.remat=False

The numbers come from `horizon.rl.runtime.memory.step_memory` (the step compiled from abstract shapes),
the same computation as the pre-run check experiments/rl.py makes (`rl.memory_check`). `--rows 0`
measures the config's own largest batch (`memory.max_step_shape`: prompts_per_step x group_size
chains of the most segments, max_context_tokens long) instead of `--rows` one-segment chains of
`--seq` tokens. `--config.a.b=v` overrides apply as in the experiments; `--check` runs exactly the
pre-run check experiments/rl.py makes (`memory.preflight`) on the config as given and exits.
"""

from __future__ import annotations

import argparse
import time

import jax
import ml_collections
import numpy as np

from horizon.agent import Segment, Trajectory
from horizon.model import transformer
from horizon.rl.algo import batch as rlbatch
from horizon.rl.algo import trainer
from horizon.rl.runtime import memory
from horizon.utils import cli, progress, provenance


def synthetic_groups(c, rows: int, seq: int, group_size: int, seed: int = 0):
    """`rows` one-segment chains of `seq` tokens, half of them model tokens, in groups of `group_size`."""
    rng = np.random.default_rng(seed)
    L = transformer.layer_counts(c.model)[1]
    k = int(c.model.num_experts_per_tok)
    trajs = []
    for _ in range(rows):
        toks = rng.integers(0, 256, seq).astype(np.int32)
        mask = np.zeros(seq, bool)
        mask[seq // 2:] = True
        ri = np.full((L, seq, k), -1, np.int32)
        ri[:, mask] = np.argsort(rng.random((L, int(mask.sum()), c.model.num_experts)), -1)[..., :k]
        logprobs = np.where(mask, -1.0, 0.0).astype(np.float32)
        seg = Segment(toks, mask, logprobs, np.where(mask, 0, -1).astype(np.int32), ri)
        trajs.append(Trajectory("t", [seg], "", {}, "final"))
    groups = [trajs[i:i + group_size] for i in range(0, rows, group_size)]
    rewards = rng.integers(0, 2, (len(groups), group_size)).astype(np.float32)
    return groups, rewards


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/selfsum_tiny.py")
    ap.add_argument("--rows", type=int, default=128, help="one-segment chains; 0 = the config's largest batch")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro-rows", type=int, nargs="*", default=[],
                    help="also measure micro-batches of these many rows (remat off and on)")
    ap.add_argument("--remat", choices=("both", "off", "on"), default="both")
    ap.add_argument("--run", action="store_true",
                    help="also run and time one step per setting (those that fit the available memory)")
    ap.add_argument("--check", action="store_true", help="run experiments/rl.py's pre-run memory check and exit")
    a, overrides = ap.parse_known_args(argv)
    if any(not o.startswith("--config.") for o in overrides):
        ap.error(f"unknown arguments {overrides}: config overrides are --config.a.b=VALUE")
    provenance.announce(config=dict(vars(a), overrides=overrides))
    try:
        c = cli.parse([f"--config={a.config}", *overrides], default=a.config)
    except ValueError as e:
        cli.fail(str(e), prog="benchmarks/rl_step_memory.py")
    if a.check:
        memory.preflight(c, prog="benchmarks/rl_step_memory.py")
        progress.say("memory check passed")
        return
    G = int(c.rl.group_size)
    groups, rewards = synthetic_groups(c, a.rows, a.seq, G) if a.run and a.rows > 0 else (None, None)
    remats = {"both": (False, True), "off": (False,), "on": (True,)}[a.remat]
    avail = memory.host_available_bytes()
    print(f"host memory available now: {avail / 2**30:.2f} GiB", flush=True)
    settings = [(r, n) for n in [0, *a.micro_rows] for r in remats]
    for remat, micro in progress.progress(settings, desc="step memory", unit="setting"):
        cs = ml_collections.ConfigDict(c.to_dict())
        cs.model.remat = remat
        cs.rl.batch.micro_rows = micro
        shape = (memory.max_step_shape(cs) if a.rows <= 0 else
                 memory.step_shape(cs, chains=a.rows, segments_per_chain=1, seq=a.seq))
        t0 = time.time()
        mem = memory.step_memory(cs, shape)
        line = (f"remat={remat!s:5} micro_rows={micro:<3d} {mem.line()}, step peak {mem.needed / 2**30:.2f} GiB "
                f"(compile {time.time() - t0:.0f}s)")
        if a.run and mem.needed > avail:
            line += ", not run (more than the available memory)"
        elif a.run:
            if groups is None:
                raise SystemExit("--run needs --rows > 0 (synthetic chains)")
            b = {k: jax.numpy.asarray(v) for k, v in rlbatch.build_batch_from_config(groups, rewards, cs).items()}
            state = trainer.init_state(transformer.init(jax.random.key(0), cs.model), cs)
            compiled = trainer.compile_train_step(state, b, cfg=cs)
            t0 = time.time()
            state, m = compiled(state, b)
            jax.block_until_ready(m)
            line += f", one step {time.time() - t0:.1f}s"
        progress.say(line)


if __name__ == "__main__":
    main()
