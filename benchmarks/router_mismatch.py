"""Sampler/trainer mismatch against the sampler's numerics: log-prob gap and routing disagreement (docs/SPEC.md §4.1).

For each sampler setting (`rl.sampler.compute_dtype` x `rl.sampler.router_noise`), the policy samples the
first turn of `--tasks` held-out prompts of the config's task family (rendered as an episode renders
them) with `horizon.inference.sampler.generate`, and the trainer rescores the samples as its step does
(`horizon.rl.algo.mismatch.report`) with router replay on and off: ``|logp_trainer - logp_sampler|``
over the sampled tokens (mean, p50, p99, max) and the share of MoE layers whose experts differ from
the sampler's. The first setting, the trainer's own numerics, is the reference each gap is divided by.

    .venv/bin/python benchmarks/router_mismatch.py --config=configs/rl_tiny.py --params=runs/rl_tiny_sft/sft

`--params` is a finished SFT checkpoint (experiments/rl.py writes one to <out_dir>/sft); without it
the model is freshly initialised. `--config.a.b=v` overrides apply as in the experiments.
"""

from __future__ import annotations

import argparse
import json

import jax
import ml_collections

from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.families import first_turn_contexts
from horizon.inference import sampler
from horizon.model import transformer
from horizon.rl.algo import mismatch
from horizon.rl.runtime.warmstart import load_sft_params
from horizon.utils import cli, progress, provenance


def setting(c, dtype: str, noise: float, replay: bool) -> ml_collections.FrozenConfigDict:
    s = ml_collections.ConfigDict(c.to_dict())
    s.rl.sampler.compute_dtype, s.rl.sampler.router_noise, s.rl.router_replay = dtype, noise, replay
    return ml_collections.FrozenConfigDict(s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/rl_tiny.py")
    ap.add_argument("--params", default="", help="SFT checkpoint directory ('' = a fresh init)")
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.1, 0.3, 1.0])
    ap.add_argument("--seed", type=int, default=0)
    a, overrides = ap.parse_known_args(argv)
    if any(not o.startswith("--config.") for o in overrides):
        ap.error(f"unknown arguments {overrides}: config overrides are --config.a.b=VALUE")
    if a.tasks < 1 or min(a.noise) < 0:
        ap.error("--tasks must be >= 1 and --noise values >= 0")
    try:
        c = cli.parse([f"--config={a.config}", *overrides], default=a.config)
    except ValueError as e:
        cli.fail(str(e), prog="benchmarks/router_mismatch.py")
    provenance.announce(config=dict(vars(a), overrides=overrides), seeds=[a.seed])
    params = load_sft_params(c, a.params) if a.params else transformer.init(jax.random.key(a.seed), c.model)
    prompts = first_turn_contexts(c, a.tasks, tokenizer_from_config(c))
    rewards = [float(i % 2) for i in range(len(prompts))]      # unused by the report; any group of rewards
    grid = [(d, n) for d in a.dtypes for n in a.noise]
    rows, ref = [], None
    for dtype, noise in progress.progress(grid, desc="sampler settings"):
        sc = setting(c, dtype, noise, True)
        out = sampler.generate(params, prompts, jax.random.key(a.seed), cfg=sc,
                               max_new_tokens=int(c.agent.max_new_tokens), sampling=sampler.sampler_config(sc))
        batch = mismatch.sampled_batch(prompts, out, sc, rewards)
        for replay in (True, False):
            r = dict(compute_dtype=dtype, router_noise=noise, router_replay=replay,
                     **mismatch.report(params, batch, cfg=setting(c, dtype, noise, replay)))
            ref = r if ref is None else ref
            r["gap_mean_vs_reference"] = r["logprob_gap_mean"] / max(ref["logprob_gap_mean"], 1e-30)
            rows.append(r)
            print("router_mismatch: " + json.dumps(r), flush=True)
    cols = ("compute_dtype", "router_noise", "router_replay", "tokens", "logprob_gap_mean", "logprob_gap_p50",
            "logprob_gap_p99", "logprob_gap_max", "routing_own", "routing_trained")
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in cols) + " |")


if __name__ == "__main__":
    main()
