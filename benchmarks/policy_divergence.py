"""How far RL runs' final policies are from a reference run's: KL on the reference's samples (docs/SPEC.md §3, §4).

The low-precision RL study (configs/sweeps/low_precision_rl.py) asks how far each precision's policy drifts
from the bf16 run's. The reference run's final policy samples the first turn of `--tasks` held-out prompts at
its own numerics; every run's final policy (and `--sft`, the checkpoint all of them started from: how far RL
moved at all) scores the same tokens with full logits at ITS OWN MoE precision (`model.moe_precision`,
`quant_division`, `quant_approx_rcp_bits` from the run's config.json), and KL(reference || run) per sampled
token is printed (mean, p50, p99, max) with the mean's ratio to the SFT row's.

    .venv/bin/python benchmarks/policy_divergence.py --reference=runs/sweeps/low_precision_rl/00_... \\
        --runs runs/sweeps/low_precision_rl/0* --sft=runs/rl_tiny_sft/sft

A run directory is an experiments/rl.py output (config.json and ckpt/, whose newest step is read).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.families import first_turn_contexts
from horizon.inference import sampler
from horizon.model import transformer
from horizon.train.checkpoint import restore_params
from horizon.utils import cli, progress, provenance

PRECISION_FIELDS = ("moe_precision", "quant_division", "quant_approx_rcp_bits")


def run_model(c, run: pathlib.Path | None) -> ml_collections.FrozenConfigDict:
    """`c.model` with the MoE precision fields of `run`'s config.json (None: `c`'s own)."""
    m = ml_collections.ConfigDict(c.model.to_dict())
    if run is not None:
        saved = json.loads((run / "config.json").read_text())["model"]
        for k in PRECISION_FIELDS:
            m[k] = saved[k]
    return ml_collections.FrozenConfigDict(m)


@functools.partial(jax.jit, static_argnames="cfg")
def _logprobs(params, tokens, *, cfg):
    logits, _ = transformer.forward(params, tokens, cfg=cfg)
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def token_kl(ref_lp: np.ndarray, lp: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """KL(ref || other) at each masked position of [b, s, V] log-prob arrays predicting the next token."""
    kl = np.sum(np.exp(ref_lp) * (ref_lp - lp), axis=-1)        # [b, s]: position t predicts token t + 1
    return kl[:, :-1][mask[:, 1:]]


def padded(prompts, out, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """[b, s] prompt + sample tokens (right-padded) and the mask of the sampled tokens."""
    seqs = [np.r_[p, t].astype(np.int32) for p, t in zip(prompts, out.tokens)]
    s = max(len(x) for x in seqs)
    tokens = np.full((len(seqs), s), pad, np.int32)
    mask = np.zeros((len(seqs), s), bool)
    for i, (x, p) in enumerate(zip(seqs, prompts)):
        tokens[i, :len(x)] = x
        mask[i, len(p):len(x)] = True
    return tokens, mask


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/rl_tiny.py")
    ap.add_argument("--reference", required=True, help="the reference run directory (its policy samples)")
    ap.add_argument("--runs", nargs="+", required=True, help="run directories to compare with it")
    ap.add_argument("--sft", default="", help="the SFT checkpoint the runs started from (a row of its own)")
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a, overrides = ap.parse_known_args(argv)
    if any(not o.startswith("--config.") for o in overrides):
        ap.error(f"unknown arguments {overrides}: config overrides are --config.a.b=VALUE")
    runs = [pathlib.Path(r) for r in a.runs]
    missing = [str(r) for r in [pathlib.Path(a.reference), *runs] if not (r / "ckpt").is_dir()
               or not (r / "config.json").is_file()]
    if a.tasks < 1 or missing:
        ap.error(f"--tasks must be >= 1 and every run directory needs config.json and ckpt/: missing in {missing}")
    try:
        c = cli.parse([f"--config={a.config}", *overrides], default=a.config)
    except ValueError as e:
        cli.fail(str(e), prog="benchmarks/policy_divergence.py")
    provenance.announce(config=dict(vars(a), overrides=overrides), seeds=[a.seed])
    tok = tokenizer_from_config(c)
    prompts = first_turn_contexts(c, a.tasks, tok)
    ref_dir = pathlib.Path(a.reference)
    ref_cfg = run_model(c, ref_dir)
    ref_params = restore_params(ref_dir / "ckpt", ref_cfg)[0]
    sc = ml_collections.ConfigDict(c.to_dict())
    sc.model = ml_collections.ConfigDict(ref_cfg.to_dict())
    sc = ml_collections.FrozenConfigDict(sc)
    out = sampler.generate(ref_params, prompts, jax.random.key(a.seed), cfg=sc,
                           max_new_tokens=int(c.agent.max_new_tokens), sampling=sampler.sampler_config(sc))
    tokens, mask = padded(prompts, out, tok.pad_id)
    ref_lp = np.asarray(_logprobs(ref_params, tokens, cfg=ref_cfg), np.float64)
    entries = ([("sft", None, pathlib.Path(a.sft))] if a.sft else []) + [(r.name, r, r / "ckpt") for r in runs]
    rows = []
    for name, run, ckpt in progress.progress(entries, desc="policies"):
        cfg = run_model(c, run) if run is not None else ref_cfg
        params = restore_params(ckpt, cfg)[0]
        kl = token_kl(ref_lp, np.asarray(_logprobs(params, tokens, cfg=cfg), np.float64), mask)
        r = dict(run=name, moe_precision=cfg.moe_precision, quant_division=cfg.quant_division, tokens=int(kl.size),
                 kl_mean=float(kl.mean()), kl_p50=float(np.quantile(kl, 0.5)), kl_p99=float(np.quantile(kl, 0.99)),
                 kl_max=float(kl.max()))
        rows.append(r)
        print("policy_divergence: " + json.dumps(r), flush=True)
    base = rows[0]["kl_mean"] if a.sft else None
    cols = ("run", "moe_precision", "quant_division", "tokens", "kl_mean", "kl_p50", "kl_p99", "kl_max")
    print("\n| " + " | ".join(cols) + (" | kl_mean / sft's" if base else "") + " |\n|"
          + "---|" * (len(cols) + bool(base)))
    for r in rows:
        cells = [f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in cols]
        print("| " + " | ".join(cells + ([f"{r['kl_mean'] / max(base, 1e-30):.3g}"] if base else [])) + " |")


if __name__ == "__main__":
    main()
