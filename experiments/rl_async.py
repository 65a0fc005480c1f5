"""Asynchronous vs synchronous RL at equal wall time (docs/SPEC.md §4, §4.1).

Runs, on the same env / model / optimizer / prompt order (configs/rl_async.py):

1. ``sync``:  the synchronous loop, `loop.run_rl` (experiments/rl.py's loop: roll out the step's
   groups with the current weights, then train) in one child process with the workers' XLA flags;
2. ``async``: the multi-process loop (`orchestrator.Orchestrator`): trainer + rollout workers,
   staleness bound `async_.max_staleness`, in-flight weight updates, delta weight sync;
3. optionally ``sync_mp``: the same multi-process loop with max_staleness=0.

`async_.compare` picks the loops, `exp.steps` is every loop's step count.

Prints throughput (rollout tokens/s, trainer steps/s), the token staleness histogram, delta
sizes of the published weights, and the time each loop needs to reach the sync loop's final
(smoothed) reward. Results go to ``<out>/results.json``.

    python experiments/rl_async.py --config=configs/rl_async_tiny.py   # rl.py's task
    python experiments/rl_async.py --config=configs/rl_async.py --config.exp.steps=30   # the toy env (no sandbox)
    python experiments/rl_async.py --config.async_.max_staleness=2 --config.rl.optim.lr=1e-4
    python experiments/rl_async.py --config.async_.compare='("sync", "async", "sync_mp")'

With configs/rl_async_tiny.py both loops run experiments/rl.py's task (config-edit family in
Docker sandboxes, same RL prompts, hyperparameters and batching) from rl.py's SFT checkpoint
(`async_.init_from`, made here with rl.py's seed and demos if missing).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys
import time

import numpy as np

from horizon.eval.report import plot_jsonl, reward_at, smooth, time_to_reach, write_jsonl
from horizon.rl.runtime import checks, orchestrator, processes, warmstart
from horizon.utils import cli
from horizon.utils.provenance import Provenance


def load_config(argv=None):
    """The validated config of `argv` (exit 2 with one line on bad input)."""
    return cli.load(argv, default="configs/rl_async_tiny.py", validate=checks.validate_async, doc=__doc__,
                    prog="experiments/rl_async.py")


def hist_text(h: dict) -> str:
    tot = sum(h.values()) or 1
    return "  ".join(f"{k}: {v} ({100 * v / tot:.0f}%)" for k, v in sorted(h.items(), key=lambda kv: int(kv[0])))


def main(argv=None):
    c = load_config(argv)
    prov = Provenance.start(c)
    w = int(c.async_.smooth)
    if str(c.async_.env) == "experiment" and str(c.async_.init_from):
        warmstart.ensure_sft_checkpoint(c, c.async_.init_from)
    steps = int(c.exp.steps)
    out = pathlib.Path(c.async_.run_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    results = {}

    if "sync" in c.async_.compare:
        t0 = time.time()
        processes.run_child(c, processes.sync_main, c, str(out / "sync"))
        r = orchestrator.summarize_sync(out / "sync")
        r["total_wall_s"] = time.time() - t0
        results["sync"] = r
        print(f"[sync]  {steps} steps in {r['wall_s']:.1f}s: {r['rollout_tokens_per_s']:.1f} rollout tok/s, "
              f"{r['trainer_steps_per_s']:.3f} steps/s, final reward (smoothed) "
              f"{smooth(r['rewards'], w)[-1]:.3f}", flush=True)

    runs = [(n, s) for n, s in (("async", int(c.async_.max_staleness)), ("sync_mp", 0)) if n in c.async_.compare]
    for name, s in runs:
        c.async_.max_staleness = s
        t0 = time.time()
        res = orchestrator.Orchestrator(c, out / name, num_steps=steps).run()
        summ = orchestrator.summarize(out / name, wall_s=time.time() - t0)
        sw = [d.get("switches", 0) for d in res["slots"].values()]
        summ["groups_with_weight_switch"] = int(sum(x > 0 for x in sw))
        summ["groups"] = len(sw)
        results[name] = summ
        ratios = [p["ratio"] for p in summ["publish"] if p["kind"] == "delta"]
        print(f"[{name}] max_staleness={s} workers={c.async_.num_rollout_workers}: {summ['steps']} steps, "
              f"{summ['rollout_tokens_per_s']:.1f} rollout tok/s, {summ['trainer_steps_per_s']:.3f} steps/s "
              f"(trainer waited {summ['trainer_wait_s']:.1f}s, trained {summ['trainer_train_s']:.1f}s; "
              f"total incl. process start {summ['wall_s']:.1f}s), final reward (smoothed) "
              f"{smooth(summ['rewards'], w)[-1]:.3f}", flush=True)
        print(f"   token staleness histogram (trainer version - token version): {hist_text(summ['staleness_hist'])}")
        print(f"   groups spanning a weight update: {summ['groups_with_weight_switch']}/{summ['groups']}; "
              f"delta/full size of published {c.async_.publish_dtype} weights: "
              f"{np.mean(ratios) if ratios else float('nan'):.3f} (mean over {len(ratios)} deltas)")
        pub = summ["publish"]
        print(f"   publish (trainer -> storage): {np.mean([p['seconds'] for p in pub]):.3f}s and "
              f"{np.mean([p['bytes'] for p in pub]) / 2**20:.2f} MiB per version (mean over {len(pub)})")

    if "sync" in results:
        sr = results["sync"]
        target = float(smooth(sr["rewards"], w)[-1])
        t_sync = time_to_reach(sr["times"], sr["rewards"], target, w)
        print(f"\ntarget = sync loop's final smoothed reward {target:.3f} (reached at {t_sync:.1f}s, "
              f"loop wall {sr['wall_s']:.1f}s)")
        for name in [n for n, _ in runs]:
            r = results[name]
            t = time_to_reach(r["times"], r["rewards"], target, w)
            at = reward_at(r["times"], r["rewards"], sr["wall_s"], w)
            results[name]["time_to_sync_reward_s"] = t
            results[name]["reward_at_sync_wall"] = at
            print(f"[{name}] reaches it at {'never' if t is None else f'{t:.1f}s'}; smoothed reward at the sync "
                  f"loop's wall time ({sr['wall_s']:.1f}s): {at if at is None else round(at, 3)}")
        results["target_reward"] = target
    results["provenance"] = prov.fields()
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    curves = [dict(loop=n, wall_s=t, reward=r, reward_smoothed=float(rs)) for n, res in results.items()
              if isinstance(res, dict) and res.get("times")
              for t, r, rs in zip(res["times"], res["rewards"], smooth(res["rewards"], w))]
    write_jsonl(out / "reward_vs_wall.jsonl", curves)
    png = plot_jsonl(out / "reward_vs_wall.jsonl", out / "reward_vs_wall.png", x="wall_s", y=["reward_smoothed"],
                     group="loop", title="train reward (smoothed) vs wall time")
    print(f"plot: {png}")
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
