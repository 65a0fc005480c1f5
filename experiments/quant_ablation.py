"""Quant ablation (docs/SPEC.md §3): tiny MoE pretraining runs that differ only in the expert-GEMM recipe.

`python experiments/quant_ablation.py --config=configs/quant_ablation.py [--config.train.output_dir=runs/x]`

For each entry of `cfg.quant.runs` (name, moe_precision, quant_division, quant_approx_rcp_bits) it
trains `cfg.train.steps` steps with `horizon.train.lm.train_step` on the DATA pipeline (same seed,
same batches), logs the train loss every step and the held-out loss every `eval_every`, and writes
`<workdir>/loss_curves.png`, `<workdir>/results.md` (final-loss table) and `<workdir>/results.json`
(one entry per run, each with its provenance: commit, config hash, seed, start, wall time, load).

The recipe is selected purely by config: `horizon.model.moe.expert_matmul` routes non-bf16
precisions to `horizon.quant.qmoe.quantized_ragged_dot` with `model.quant_division`.
"""

import json
import pathlib
import sys
import time

import jax
import numpy as np

from horizon.data import pipeline
from horizon.model.moe import PRECISIONS_IMPLEMENTED, PRECISIONS_PLANNED
from horizon.parallel.mesh import require_one_device
from horizon.train import lm
from horizon.utils import cli
from horizon.utils.config import ConfigError
from horizon.utils.progress import progress, say
from horizon.utils.provenance import Provenance
from horizon.utils.seeds import run_keys


def validate(c) -> None:
    """The tiny pretraining config plus `quant.runs`: (name, moe_precision, division, rcp bits) each."""
    lm.validate_train_config(c)
    require_one_device(c)             # the ablation's steps run unsharded
    known = PRECISIONS_IMPLEMENTED + PRECISIONS_PLANNED
    for run in c.quant.runs:
        if len(run) != 4 or run[1] not in known or run[2] not in ("ieee", "approx"):
            raise ConfigError(f"quant.runs entry {run!r}: must be (name, moe_precision in {known}, "
                              "'ieee'|'approx', rcp bits)")


def run_one(cfg, name, precision, division, bits, eval_set):
    c = cfg.copy_and_resolve_references()
    c.model.moe_precision = precision
    c.model.quant_division = division
    c.model.quant_approx_rcp_bits = bits
    prov = Provenance.start(c)
    train_fn, eval_fn = lm.jit_train_step(c), lm.jit_eval_step(c)
    state = lm.init_state(jax.random.key_data(run_keys(c.seed)["init"]), c)
    batches = pipeline.make_batches(c, "train", start_step=0)
    losses, evals, t0 = [], [], time.time()
    evals.append((0, lm.evaluate(eval_fn, state.params, eval_set)["eval_loss"]))
    with progress(range(1, c.train.steps + 1), desc=f"quant {name}", unit="step", leave=False) as bar:
        for step in bar:
            state, m = train_fn(state, next(batches))
            losses.append(float(m["loss"]))
            if not np.isfinite(losses[-1]):
                say(f"  {name}: non-finite loss at step {step}; stopping this run")
                break
            if step % c.train.eval_every == 0 or step == c.train.steps:
                evals.append((step, lm.evaluate(eval_fn, state.params, eval_set)["eval_loss"]))
    wall = time.time() - t0
    say(f"{name:28s} final train {np.mean(losses[-10:]):.4f} | eval {evals[-1][1]:.4f} | {wall:.0f}s")
    return {"name": name, "precision": precision, "division": division, "approx_bits": bits,
            "train_loss": losses, "evals": evals, "wall_s": wall, "provenance": prov.fields()}


def plot(results, out: pathlib.Path, smooth: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    bf16 = np.asarray(results[0]["train_loss"])
    for r in results:
        y = np.asarray(r["train_loss"])
        k = min(smooth, len(y))
        ys = np.convolve(y, np.ones(k) / k, mode="valid")
        a1.plot(np.arange(k, len(y) + 1), ys, label=r["name"])
        n = min(len(y), len(bf16))
        d = np.convolve(y[:n] - bf16[:n], np.ones(k) / k, mode="valid")
        a2.plot(np.arange(k, n + 1), d, label=r["name"])
    a1.set(xlabel="step", ylabel=f"train CE (moving avg {smooth})", title="loss")
    a2.set(xlabel="step", ylabel="train CE - bf16 CE", title="gap to bf16")
    for a in (a1, a2):
        a.grid(alpha=0.3), a.legend(fontsize=7)
    fig.tight_layout(), fig.savefig(out, dpi=100), plt.close(fig)


def table(results) -> str:
    base = results[0]
    b_ev = base["evals"][-1][1]
    lines = ["| run | moe_precision | division | rcp bits | final train CE (mean last 10) | final held-out CE | "
             "held-out - bf16 | wall s |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        tr, ev = np.mean(r["train_loss"][-10:]), r["evals"][-1][1]
        lines.append(f"| {r['name']} | {r['precision']} | {r['division']} | {r['approx_bits']} | {tr:.4f} | "
                     f"{ev:.4f} | {ev - b_ev:+.4f} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    cfg = cli.load(argv, default="configs/quant_ablation.py", validate=validate, doc=__doc__,
                   prog="experiments/quant_ablation.py")
    workdir = pathlib.Path(cfg.train.output_dir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    eval_set = pipeline.eval_batches(cfg)
    print(f"workdir {workdir}; {cfg.train.steps} steps x {cfg.data.batch_size}x{cfg.data.seq_len} tokens")
    results = [run_one(cfg, *spec, eval_set) for spec in progress(cfg.quant.runs, desc="quant ablation", unit="run")]
    plot(results, workdir / "loss_curves.png", cfg.quant.smooth)
    md = table(results)
    (workdir / "results.md").write_text(f"# Quant ablation ({cfg.train.steps} steps, tiny MoE)\n\n{md}")
    (workdir / "results.json").write_text(json.dumps(results))
    print("\n" + md + f"\nfiles: {workdir}/{{loss_curves.png, results.md, results.json}}")


if __name__ == "__main__":
    main(sys.argv[1:])
