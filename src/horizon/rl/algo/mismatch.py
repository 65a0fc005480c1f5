"""How far a sampler's token log-probs and routing are from the trainer's on an RL batch (docs/SPEC.md §4.1).

The RL step logs the batch means (`sampler_logprob_diff`, `routing/*`); `report` gives the per-token
distribution a study of sampler/trainer mismatch needs (mean, median, p99, max of
``|logp_trainer - logp_sampler|`` over the loss tokens) with the trainer run as the step runs it
(`rl.router_replay` on or off), and the share of MoE layers whose experts differ from the
sampler's: the trainer's own choice (``routing_own``) and the routing it trains with
(``routing_trained``: 0 under plain replay, > 0 where the plausibility filter overrides a record).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import numpy as np

from horizon.agent import Segment, Trajectory
from horizon.inference.sampler import SampleOutput
from horizon.model import transformer
from horizon.rl.algo import routing, trainer
from horizon.rl.algo.batch import batch_config, build_batch


@functools.partial(jax.jit, static_argnames="cfg")
def _trainer_view(params, tokens, recorded, *, cfg):
    """(token log-probs [r, s], own routing, trained routing) of the trainer on `tokens`."""
    replay, own = routing.replay_for(params, tokens, recorded, cfg=cfg)
    hidden, aux = transformer.hidden_states(params, tokens, cfg=cfg.model, replay_indices=replay)
    lp, _ = trainer.policy_logprobs(params, hidden, tokens, cfg=cfg)
    trained = aux["router_indices"]
    return lp, trained if own is None else own, trained


def report(params, batch: dict, *, cfg) -> dict[str, float]:
    """Mismatch statistics of one unsplit RL batch (`batch.build_batch`, with the sampler's
    ``sampler_logprobs`` and ``replay_indices``) under the trainer config `cfg` (a FrozenConfigDict)."""
    tokens = np.asarray(batch["tokens"])
    recorded = np.asarray(batch["replay_indices"])
    lp, own, trained = _trainer_view(params, tokens, recorded, cfg=cfg)
    mask = np.asarray(batch["loss_mask"], bool)
    gap = np.abs(np.asarray(lp, np.float64) - np.asarray(batch["sampler_logprobs"], np.float64))[mask]
    out = dict(tokens=float(mask.sum()))
    if gap.size:
        out.update(logprob_gap_mean=float(gap.mean()), logprob_gap_p50=float(np.quantile(gap, 0.5)),
                   logprob_gap_p99=float(np.quantile(gap, 0.99)), logprob_gap_max=float(gap.max()))
    if recorded.shape[0] > 0:
        out["routing_own"] = float(routing.disagreement(own, recorded, mask))
        out["routing_trained"] = float(routing.disagreement(trained, recorded, mask))
    return out


def sampled_batch(prompts: Sequence[np.ndarray], out: SampleOutput, cfg, rewards: Sequence[float]) -> dict:
    """`generate`'s continuations of `prompts` as one group of one-segment chains, laid out as the RL
    loop lays out a turn (the prompt unmasked and unrecorded, then the generated tokens with the
    sampler's log-probs and routing), with the chains' `rewards`."""
    L, k = transformer.layer_counts(cfg.model)[1], int(cfg.model.num_experts_per_tok)
    chains = []
    for p, t, lp, ri in zip(prompts, out.tokens, out.logprobs, out.router_indices):
        n, m = len(p), len(t)
        mask = np.r_[np.zeros(n, bool), np.ones(m, bool)]
        rec = np.full((L, n + m, k), -1, np.int32)
        rec[:, n:] = ri
        seg = Segment(np.r_[p, t].astype(np.int32), mask, np.r_[np.zeros(n), lp].astype(np.float32),
                      np.where(mask, 0, -1).astype(np.int32), rec)
        chains.append(Trajectory("sampled", [seg], "", {}, "final"))
    return build_batch([chains], np.asarray([rewards], np.float32), batch_config(cfg))
