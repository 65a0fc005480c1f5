"""Trainer/rollout balance and staleness at 8, 64 and 512 rollout nodes, simulated from a measured run.

Reads an `experiments/rl_async.py` run directory (`<run_dir>/async`: events.jsonl, trainer.jsonl)
and takes from it, as measured on this machine:
  * the wall time of one generation batch (the `seconds` of each written group: a worker
    generates a batch of `rl.slots_per_batch` groups at once, so each group reports its batch's time),
    resampled with replacement (keeps the long tail of multi-turn episodes);
  * the trainer's time per group (`train_s / groups` of each step after the first, which compiles)
    and its fixed per-step cost (the publish time).
Then a discrete-event simulation of `orchestrator.Orchestrator`'s admission control (docs/SPEC.md §4: a batch
of step t starts only while ``t - newest_version <= max_staleness``) with W rollout nodes, each
generating one batch at a time, a step = one batch per node (N = W × batch groups), and H trainer
hosts dividing the per-group cost (data parallel, linear: optimistic for the trainer). H is set so
that the trainer's mean step time equals the mean batch time × `--trainer-load` (1.0 = balanced).
Staleness is counted at the batch's start (in-flight weight updates only lower it).
`--tail-sigma` stretches the measured distribution (lognormal factor of mean 1) to ask what
longer-tailed tasks (real coding episodes) do to the synchronous straggler cost.

    python benchmarks/scaling_sim.py --run runs/rl_async_tiny/async
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import math
import pathlib

import numpy as np

from horizon.utils import progress, provenance


def measured(run: pathlib.Path) -> dict:
    ev = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    batch_s = np.array([e["seconds"] for e in ev if e.get("kind") == "grouped" and e.get("wrote")], float)
    steps = [json.loads(x) for x in (run / "trainer.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["event"] == "step"]
    if len(steps) < 2 or len(batch_s) < 2:
        raise SystemExit(f"{run}: need >= 2 trainer steps and groups (run experiments/rl_async.py first)")
    per_group = np.array([r["train_s"] / len(r["slots"]) for r in steps[1:]])
    publish = [p["seconds"] for r in steps for p in r.get("publish", [])]
    return dict(batch_s=batch_s, train_per_group_s=float(np.median(per_group)),
                publish_s=float(np.median(publish)) if publish else 0.0, groups_per_batch=groups_per_batch(ev))


def groups_per_batch(ev) -> int:
    """Groups per generation batch: the groups of one batch report the same (worker, seconds)."""
    n = collections.Counter((e["worker"], e["seconds"]) for e in ev if e.get("kind") == "grouped" and e.get("wrote"))
    return int(round(np.median(list(n.values()))))


def simulate(W: int, max_staleness: int, m: dict, trainer_hosts: int, steps: int, seed: int,
             tail_sigma: float = 0.0) -> dict:
    """One run of W nodes for `steps` trainer steps; returns throughput, idle fractions, staleness."""
    rng = np.random.default_rng(seed)
    t_train = m["publish_s"] + m["train_per_group_s"] * W * m["groups_per_batch"] / trainer_hosts
    now, v, next_batch = 0.0, 0, 0
    done_per_step: dict[int, int] = {}
    free = W
    heap: list = []
    busy_node_s = trainer_busy = 0.0
    trainer_free_at = None
    stale = []
    while v < steps:
        while free and next_batch // W - v <= max_staleness and next_batch // W < steps:
            d = float(rng.choice(m["batch_s"])) * float(rng.lognormal(-tail_sigma ** 2 / 2, tail_sigma))
            heapq.heappush(heap, (now + d, "batch", (next_batch // W, v)))
            busy_node_s += d
            free -= 1
            next_batch += 1
        if trainer_free_at is None and done_per_step.get(v, 0) == W:
            trainer_free_at = now + t_train
            trainer_busy += t_train
            heapq.heappush(heap, (trainer_free_at, "train", v))
        now, kind, data = heapq.heappop(heap)
        if kind == "batch":
            step, start_v = data
            done_per_step[step] = done_per_step.get(step, 0) + 1
            stale.append(step - start_v)
            free += 1
        else:
            v, trainer_free_at = v + 1, None
    h = np.bincount(stale)
    return dict(steps_per_hour=3600 * steps / now, trainer_busy=trainer_busy / now,
                rollout_busy=busy_node_s / (W * now), step_s=t_train,
                staleness={i: round(float(c) / len(stale), 3) for i, c in enumerate(h) if c})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="experiments/rl_async.py's <run_dir>/async")
    ap.add_argument("--nodes", default="8,64,512")
    ap.add_argument("--staleness", default="0,1,2")
    ap.add_argument("--trainer-load", type=float, default=1.0, help="trainer step / mean batch time")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tail-sigma", type=float, default=0.0,
                    help="multiply each batch time by lognormal noise (mean 1, this sigma): longer-tailed tasks")
    a = ap.parse_args()
    provenance.announce(config=vars(a), seeds=a.seed)
    m = measured(pathlib.Path(a.run))
    b = m["batch_s"]
    print(f"measured ({a.run}): batch time mean {b.mean():.1f}s p50 {np.median(b):.1f}s p90 "
          f"{np.quantile(b, 0.9):.1f}s max {b.max():.1f}s over {len(b)} groups; {m['groups_per_batch']} groups/batch; "
          f"trainer {m['train_per_group_s']:.2f}s/group + publish {m['publish_s']:.2f}s/step")
    print("| rollout nodes | trainer hosts | max_staleness | trainer step s | steps/h | trainer busy | "
          "rollout busy | staleness (fraction of batches) |")
    print("|---|---|---|---|---|---|---|---|")
    cases = [(W, s) for W in map(int, a.nodes.split(",")) for s in map(int, a.staleness.split(","))]
    for W, s in progress.progress(cases, desc="simulations", unit="run"):
        work = m["train_per_group_s"] * W * m["groups_per_batch"]
        H = max(1, math.ceil(work / max(1e-9, a.trainer_load * b.mean() - m["publish_s"])))
        r = simulate(W, s, m, H, a.steps, a.seed, a.tail_sigma)
        progress.say(f"| {W} | {H} | {s} | {r['step_s']:.1f} | {r['steps_per_hour']:.0f} | {r['trainer_busy']:.2f} | "
                     f"{r['rollout_busy']:.2f} | {r['staleness']} |")


if __name__ == "__main__":
    main()
