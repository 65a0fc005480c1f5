"""One pretraining stage: the loop of experiments/pretrain.py (docs/SPEC.md §8).

`train_stage(cfg, prov)` trains `cfg` in `cfg.train.output_dir`: the one `lm` train step on the mesh
of `cfg.mesh` (docs/SPEC.md §2), train loss every `log_every`, held-out loss every `eval_every` (and
at step 0) through `horizon.utils.tracking.MetricsWriter` (metrics.jsonl, TensorBoard, W&B), a
checkpoint every `checkpoint_every`, at each of `save_steps` (0 = the init; held-out loss is evaluated
there and kept in the checkpoint's meta, so a run started from it, `model.init_checkpoint`, reports it)
and at the end, a loss-curve PNG and summary.json (with provenance). It resumes from the newest
checkpoint in that directory (also across meshes); a stage whose last step is already checkpointed
trains nothing and only rewrites its summary. Without a checkpoint, `init_params()` (when given)
replaces the fresh params: a later stage starts from an earlier one's params with a fresh optimizer
state (`horizon.train.stages`, docs/SPEC.md §1.4).
"""

from __future__ import annotations

import itertools
import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from horizon.data import pipeline
from horizon.parallel import mesh as pmesh
from horizon.parallel import sharded
from horizon.train import checkpoint, lm
from horizon.utils import compiles
from horizon.utils.config import dump_config
from horizon.utils.progress import progress, say
from horizon.utils.provenance import Provenance
from horizon.utils.seeds import run_keys
from horizon.utils.tracking import MetricsWriter


def read_records(path: pathlib.Path, max_step: int | None = None) -> list[dict]:
    """metrics.jsonl's records (those at steps <= `max_step` when given); [] if there is no file."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r for r in recs if max_step is None or r["step"] <= max_step]


def plot(recs: list[dict], out: pathlib.Path) -> None:
    """Train and held-out loss against step, as a PNG."""
    import matplotlib  # noqa: PLC0415 - plotting only at the end of a run
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("loss", "train"), ("eval_loss", "held-out")):
        pts = [(r["step"], r[key]) for r in recs if key in r]
        if pts:
            ax.plot(*zip(*pts), label=label, marker="." if key == "eval_loss" else None)
    ax.set_xlabel("step"), ax.set_ylabel("next-token CE (nats)"), ax.legend(), ax.grid(alpha=0.3)
    fig.tight_layout(), fig.savefig(out, dpi=100), plt.close(fig)


def train_stage(cfg: ml_collections.ConfigDict, prov: Provenance, *, desc: str = "pretrain",
                init_params: Callable[[], Any] | None = None) -> tuple[dict, lm.TrainState]:
    """(summary, final state) of one stage (module docstring)."""
    # long function: the loop of experiments/pretrain.py as one piece (setup, resume, steps, summary)
    tc = cfg.train
    compiles.use_persistent_cache(str(tc.get("compilation_cache_dir", "") or ""))
    workdir = pathlib.Path(tc.output_dir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, workdir / "config.json")
    (workdir / "seed.txt").write_text(f"{cfg.seed}\n")
    metrics_path = workdir / "metrics.jsonl"

    mesh = pmesh.mesh_from_config(cfg)        # default: one device; c.mesh picks FSDP / EP / CP
    state = lm.init_state(jax.random.key_data(run_keys(cfg.seed)["init"]), cfg)
    train_fn, st_sh, _ = lm.make_train_step(cfg, mesh, jax.eval_shape(lambda: state))
    eval_fn = lm.make_eval_step(cfg, mesh, jax.eval_shape(lambda: state.params))
    state = jax.device_put(state, st_sh)      # params / optimizer state by the logical-axis rules
    ckpt = checkpoint.Checkpointer(workdir / "checkpoints", every=tc.checkpoint_every, keep=tc.max_checkpoints)
    restored = ckpt.restore_latest(state)
    start = 0
    if restored is not None:
        state, meta = restored
        start = int(meta["data_step"])
        # Drop records logged after the checkpoint (the run died past it): they are redone.
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in read_records(metrics_path, start)))
        print(f"resumed from {ckpt.directory}/{start} (data position {start})")
    else:
        if init_params is not None:           # a later stage: the earlier one's params, a fresh optimizer
            state = jax.device_put(state._replace(params=init_params()), st_sh)
        if metrics_path.exists():
            metrics_path.unlink()
    log = MetricsWriter(workdir, cfg, purge_step=start or None)    # metrics.jsonl + TensorBoard (+ W&B)
    print(f"workdir {workdir}; mesh {dict(mesh.shape)}; data {pipeline.corpus_stats(cfg)}")
    eval_set = pipeline.eval_batches(cfg)
    batches = pipeline.make_batches(cfg, "train", start_step=start)

    def run_eval(step):
        rec = {"step": step, **lm.evaluate(eval_fn, state.params, eval_set)}
        log(rec)
        return rec["eval_loss"]

    first = next(batches)
    coll = sharded.compiled_collectives(train_fn, state, first)   # what the partitioned step communicates
    print("train step collectives (bytes per device): " + (", ".join(f"{k} {v:,}" for k, v in coll.items() if v)
                                                          or "none"), flush=True)
    batches = itertools.chain([first], batches)
    keep_steps = {int(k) for k in tc.get("save_steps", ())}    # budgets a later run starts from (eval + save)
    last_eval = run_eval(0) if start == 0 else float("nan")

    def save(step, evaluated):
        meta = {"data_step": step, "seed": cfg.seed, **({"eval_loss": last_eval} if evaluated else {})}
        ckpt.save(step, state, meta, force=True)

    if start == 0 and 0 in keep_steps:
        save(0, True)
    t_start, t_first, tokens = time.time(), None, 0.0  # tokens/s measured after the first (compiling) step
    step = start
    bar = progress(total=tc.steps, initial=start, desc=desc, unit="step")
    while step < tc.steps:
        state, m = train_fn(state, next(batches))
        step += 1
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        if t_first is None:
            t_first = time.time()
        else:
            tokens += m["tokens"]
        evaluated = step % tc.eval_every == 0 or step == tc.steps or step in keep_steps
        if evaluated:
            last_eval = run_eval(step)
        if step % tc.log_every == 0 or step == tc.steps:
            tps = tokens / max(time.time() - t_first, 1e-9)
            log({"step": step, **m, "tokens_per_s": tps})
            say(f"step {step:5d} | loss {m['loss']:.4f} | eval {last_eval:.4f} | lr {m['lr']:.2e} "
                f"| gnorm {m['grad_norm']:.3f} | {tps:,.0f} tok/s")
            bar.set_postfix(loss=m["loss"])
        bar.update(1)
        if ckpt.should_save(step) or step == tc.steps or step in keep_steps:
            save(step, evaluated)
    bar.close()
    ckpt.close()

    recs = read_records(metrics_path)
    plot(recs, workdir / "loss_curve.png")
    evals = [r for r in recs if "eval_loss" in r]
    wall = time.time() - t_start
    tps = tokens / max(time.time() - t_first, 1e-9) if tokens else next(
        (r["tokens_per_s"] for r in reversed(recs) if "tokens_per_s" in r), 0.0)  # nothing left to run
    summary = {"init_eval_loss": evals[0]["eval_loss"], "final_eval_loss": evals[-1]["eval_loss"],
               "eval_drop_pct": 100.0 * (1 - evals[-1]["eval_loss"] / evals[0]["eval_loss"]),
               "train_tokens_per_s": tps, "wall_s_this_process": wall, "steps": tc.steps,
               "mesh": dict(mesh.shape), "collectives": coll, "provenance": prov.fields()}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    log.close(final=summary)
    print(f"\ninit eval loss {summary['init_eval_loss']:.4f} -> final {summary['final_eval_loss']:.4f} "
          f"({summary['eval_drop_pct']:.1f}% drop) | {tps:,.0f} train tok/s | {wall:.0f}s\n"
          f"files: {workdir}/{{metrics.jsonl, loss_curve.png, summary.json, config.json, checkpoints/}}")
    return summary, state
