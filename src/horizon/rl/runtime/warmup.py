"""Compile a run's shapes before its first step (docs/INFERENCE.md, "Compile once"; `exp.warmup`).

An RL step compiles what its shapes need the first time they occur: engine calls (attention
windows, prefill chunks, row buckets) and train steps (lengths, rows). Every one of those shapes
comes from a finite set fixed by the config, so `warm_up` compiles the whole set up front, with a
progress line: the engine's plan (`horizon.inference.warmup`) and the train step's (`train_plan`,
lowered and compiled ahead of time on the run's own state and abstract batches: nothing trained; an
abstract copy of the state need not trace to the same program, e.g. for params that came from a
mesh-sharded SFT step). After it, a step
compiles nothing, and with the persistent compilation cache (`exp.compilation_cache_dir`) a later
process (another seed, a resumed run, the next study) reads every executable from disk.
"""

from __future__ import annotations

import time

from horizon.inference import warmup as engine_warmup
from horizon.inference.config import engine_config
from horizon.inference.replicas import make_engine
from horizon.rl.algo import accumulate, trainer
from horizon.rl.runtime import memory as rlmemory
from horizon.utils import compiles
from horizon.utils.progress import progress, say
from horizon.utils.shapes import bucket


def train_plan(c) -> list[rlmemory.StepShape]:
    """The train-step shapes a run can produce: with `rl.batch.micro_rows` > 0 one micro-batch step per
    length bucket (`accumulate.seq_buckets`; the update step compiles with the first); else one
    one-pass step per (rows, length) bucket up to `memory.max_step_shape`'s."""
    top = rlmemory.max_step_shape(c)
    seqs = [s for s in accumulate.seq_buckets(c) if s <= top.seq] or [top.seq]
    if top.micro_rows > 0:
        return [rlmemory.StepShape(top.micro_rows, s, top.groups, top.micro_rows, 1) for s in seqs]
    rows, r = [], bucket(1, int(c.rl.batch.min_rows))
    while r <= top.rows:
        rows.append(r)
        r *= 2
    return [rlmemory.StepShape(r, s, top.groups) for r in rows for s in seqs]


def warm_up(state, c, *, tag: str = "") -> dict:
    """Compile the engine's plan on `state.params` and the train step's shapes for config `c` and the
    run's `RLState` `state` (its shapes and placement: a jitted call hits the compiled executable only
    if both match); prints one line with what it compiled. Returns {"warmup_s", "time/compile_*"}."""
    t0, c0 = time.time(), compiles.meter().snapshot()
    ec = engine_config(c)
    steps = (int(c.rl.sampler.chunk_tokens),)
    n_engine = len(engine_warmup.plan(ec, steps).calls()) * max(1, ec.replicas)
    shapes = train_plan(c)
    bar = progress(total=n_engine + len(shapes), desc=f"{tag}warm-up", unit="shape")
    engine_warmup.warm_up(make_engine(c, params=state.params), decode_steps=steps, on_call=lambda: bar.update(1))
    for shape in shapes:              # lowered on the run's own state (nothing runs): its steps' exact signature
        trainer.compile_train_step(state, rlmemory.abstract_batch(c, shape), cfg=c)
        bar.update(1)
    bar.close()
    if shapes and shapes[0].micro_rows > 0:
        trainer.compile_apply(state, rlmemory.abstract_batch(c, shapes[0]), cfg=c)
    done = compiles.meter().snapshot().minus(c0)
    rec = dict(warmup_s=time.time() - t0, **done.record("time/compile_"))
    say(f"{tag}warm-up: {n_engine} engine calls and {len(shapes)} train shapes in {rec['warmup_s']:.0f}s "
        f"({done.compiles} executables compiled, {done.cache_hits} read from the persistent cache; "
        f"slowest {done.top()})")
    return rec
