"""Asynchronous vs synchronous RL at equal wall time (SPEC §4, §4.1).

Runs, on the same env / model / optimizer / prompt order (configs/rl_async.py):

1. ``sync``:  the single-process synchronous loop (`async_loop.run_sync_inprocess`: roll out
   the step's groups with the current weights, then train; like experiments/rl.py);
2. ``async``: the multi-process loop (`async_loop.Orchestrator`): trainer + rollout workers,
   staleness bound `async_.max_staleness`, in-flight weight updates, delta weight sync;
3. optionally ``sync_mp`` (``--with_sync_mp``): the same multi-process loop with max_staleness=0.

Prints throughput (rollout tokens/s, trainer steps/s), the token staleness histogram, delta
sizes of the published weights, and the time each loop needs to reach the sync loop's final
(smoothed) reward. Results go to ``<out>/results.json``.

    python experiments/rl_async.py                                   # configs/rl_async_tiny.py: rl.py's task
    python experiments/rl_async.py --config=configs/rl_async.py --steps 30   # the toy env (no sandbox)
    python experiments/rl_async.py --set async_.max_staleness=2 --set exp.rl.optim.lr=1e-4

With configs/rl_async_tiny.py both loops run experiments/rl.py's task (config-edit family in
Docker sandboxes, same RL prompts, hyperparameters and batching) from rl.py's SFT checkpoint
(`async_.init_from`, made here with rl.py's seed and demos if missing).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from horizon.rl import async_loop  # noqa: E402
from horizon.utils.config import apply_overrides, load_config_file, merge_experiment  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "rl_async_tiny.py"))
    p.add_argument("--steps", type=int, default=None, help="trainer steps (default async_.num_steps)")
    p.add_argument("--out", default=None, help="output dir (default async_.run_dir)")
    p.add_argument("--with_sync_mp", action="store_true", help="also run the multi-process loop with max_staleness=0")
    p.add_argument("--skip_sync", action="store_true")
    p.add_argument("--smooth", type=int, default=5, help="moving-average window over steps for reward targets")
    p.add_argument("--set", action="append", default=[], metavar="a.b=VALUE", help="config override (JSON value)")
    return p.parse_args(argv)


def ensure_warm_start(c) -> None:
    """Make `async_.init_from` (experiments/rl.py's SFT stage, same seed and demos) if missing."""
    from horizon.data.tokenizer import ByteTokenizer
    from horizon.rl import loop
    from horizon.tasks.families import family_from_config

    d = pathlib.Path(c.async_.init_from)
    try:
        loop.load_sft_params(c, d)
        return
    except FileNotFoundError:
        pass
    print(f"no SFT checkpoint in {d}: running experiments/rl.py's SFT stage there", flush=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    log = loop.JsonlLog(d.parent / "sft_metrics.jsonl")
    loop.config_edit_warm_start(c, family_from_config(c.exp), ByteTokenizer(c.model.vocab_size), d.parent, log,
                                loop.experiment_keys(c)["init"], name=d.name)
    log.close()


def smooth(x, w):
    x = np.asarray(x, np.float64)
    if len(x) == 0:
        return x
    w = max(1, min(w, len(x)))
    c = np.cumsum(np.insert(x, 0, 0.0))
    out = np.empty_like(x)
    for i in range(len(x)):
        lo = max(0, i - w + 1)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def time_to_reach(times, rewards, target, w):
    s = smooth(rewards, w)
    hit = np.nonzero(s >= target - 1e-9)[0]
    return float(times[hit[0]]) if len(hit) else None


def reward_at(times, rewards, t, w):
    s = smooth(rewards, w)
    idx = [i for i, ti in enumerate(times) if ti <= t]
    return float(s[idx[-1]]) if idx else None


def hist_text(h: dict) -> str:
    tot = sum(h.values()) or 1
    return "  ".join(f"{k}: {v} ({100 * v / tot:.0f}%)" for k, v in sorted(h.items(), key=lambda kv: int(kv[0])))


def main(argv=None):
    a = parse_args(argv)
    c = load_config_file(a.config)
    apply_overrides(c, a.set)
    if "exp" in c:
        merge_experiment(c)                  # --set exp.* overrides reach c.rl / c.agent / c.model
    if str(c.async_.env) == "experiment" and str(c.async_.init_from):
        ensure_warm_start(c)
    steps = int(a.steps if a.steps is not None else c.async_.num_steps)
    out = pathlib.Path(a.out or c.async_.run_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    results = {}

    if not a.skip_sync:
        t0 = time.time()
        r = async_loop.run_sync_inprocess(c, out / "sync", steps)
        r["total_wall_s"] = time.time() - t0
        results["sync"] = r
        print(f"[sync]  {steps} steps in {r['wall_s']:.1f}s: {r['rollout_tokens_per_s']:.1f} rollout tok/s, "
              f"{r['trainer_steps_per_s']:.3f} steps/s, final reward (smoothed) "
              f"{smooth(r['rewards'], a.smooth)[-1]:.3f}", flush=True)

    runs = [("async", int(c.async_.max_staleness))]
    if a.with_sync_mp:
        runs.append(("sync_mp", 0))
    for name, s in runs:
        c.async_.max_staleness = s
        t0 = time.time()
        res = async_loop.Orchestrator(c, out / name, num_steps=steps).run()
        summ = async_loop.summarize(out / name, wall_s=time.time() - t0)
        sw = [d.get("switches", 0) for d in res["slots"].values()]
        summ["groups_with_weight_switch"] = int(sum(x > 0 for x in sw))
        summ["groups"] = len(sw)
        results[name] = summ
        ratios = [p["ratio"] for p in summ["publish"] if p["kind"] == "delta"]
        print(f"[{name}] max_staleness={s} workers={c.async_.num_rollout_workers}: {summ['steps']} steps, "
              f"{summ['rollout_tokens_per_s']:.1f} rollout tok/s, {summ['trainer_steps_per_s']:.3f} steps/s "
              f"(trainer waited {summ['trainer_wait_s']:.1f}s, trained {summ['trainer_train_s']:.1f}s; "
              f"total incl. process start {summ['wall_s']:.1f}s), final reward (smoothed) "
              f"{smooth(summ['rewards'], a.smooth)[-1]:.3f}", flush=True)
        print(f"   token staleness histogram (trainer version - token version): {hist_text(summ['staleness_hist'])}")
        print(f"   groups spanning a weight update: {summ['groups_with_weight_switch']}/{summ['groups']}; "
              f"delta/full size of published {c.async_.publish_dtype} weights: "
              f"{np.mean(ratios) if ratios else float('nan'):.3f} (mean over {len(ratios)} deltas)")

    if "sync" in results:
        sr = results["sync"]
        target = float(smooth(sr["rewards"], a.smooth)[-1])
        t_sync = time_to_reach(sr["times"], sr["rewards"], target, a.smooth)
        print(f"\ntarget = sync loop's final smoothed reward {target:.3f} (reached at {t_sync:.1f}s, "
              f"loop wall {sr['wall_s']:.1f}s)")
        for name in [n for n, _ in runs]:
            r = results[name]
            t = time_to_reach(r["times"], r["rewards"], target, a.smooth)
            at = reward_at(r["times"], r["rewards"], sr["wall_s"], a.smooth)
            results[name]["time_to_sync_reward_s"] = t
            results[name]["reward_at_sync_wall"] = at
            print(f"[{name}] reaches it at {'never' if t is None else f'{t:.1f}s'}; smoothed reward at the sync "
                  f"loop's wall time ({sr['wall_s']:.1f}s): {at if at is None else round(at, 3)}")
        results["target_reward"] = target
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
