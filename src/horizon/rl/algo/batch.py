"""Chain-of-segments batch layout for the RL trainer (docs/SPEC.md §4 "Advantages for summary chains", §6).

Input: `groups[g]` = the G rollouts (chains, `horizon.agent.Trajectory`) of prompt g and
`rewards[g][j]` = the scalar reward of chain (g, j) (verifier + shaping, `horizon.env.rewards`).
The group baseline is computed per prompt over whole chains (`losses.group_advantages`,
Dr.GRPO: reward - group mean, no std division by default). Every segment of a chain becomes
its **own row** (its context was rewritten, so it is a separate sequence) and every row of
chain c gets chain c's advantage (`losses.broadcast_chain_advantages`).

Arrays, all aligned to `tokens` (column t describes token t):

    tokens            int32 [R, S]   segment ids, right-padded with PAD
    valid             bool  [R, S]   real (non-pad) tokens
    loss_mask         bool  [R, S]   model-generated tokens only (prompt/observations/pad False)
    sampler_logprobs  f32   [R, S]   the sampler's log-prob of token t (0 off the mask)
    policy_versions   int32 [R, S]   weights version that sampled token t (-1 off the mask)
    replay_indices    int32 [L_moe, R*S, k]  experts that processed token t at inference,
                                     flattened row-major like `transformer.forward`'s aux;
                                     -1 where none was recorded (prompt, observations, pad):
                                     the trainer fills those from the router's own choice
    advantages        f32   [R]      chain advantage, 0 for padding rows
    row_chain         int32 [R]      chain id g*G + j (-1 = padding row)
    row_segment       int32 [R]      segment index within its chain
    row_group         int32 [R]      prompt group id (-1 = padding row)
    truncated         bool  [R]      the chain ended by a length limit (for overlong masking)
    chain_advantages  f32   [C]      C = groups_bucket * G (0 for padding groups)
    group_rewards     f32   [Nb, G]  rewards per group (for reward / best-of-K metrics)
    group_valid       bool  [Nb]

R, S and Nb are bucketed (powers of two with config minimums) so the jitted train step compiles
once per bucket. The trainer's logits at column t-1 predict token t; column 0 (BOS) is never a
model token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from horizon.data.tokenizer import tokenizer_from_config
from horizon.model import transformer
from horizon.rl.algo import losses
from horizon.utils.shapes import bucket

# end reasons (horizon.agent.rollout) that mean "cut by a length/step limit"
DEFAULT_TRUNCATED_REASONS = ("token_budget", "context_full", "max_steps")
# `build_batch`'s arrays, in its dict's order (module docstring)
BATCH_FIELDS = ("tokens", "valid", "loss_mask", "sampler_logprobs", "policy_versions", "replay_indices", "advantages",
                "row_chain", "row_segment", "row_group", "truncated", "chain_advantages", "group_rewards",
                "group_valid")


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """The static options of `build_batch` (docs/SPEC.md §4), built once from the config
    (`batch_config`): the model's MoE shape for the replay indices, the tokenizer's `pad_id`, the
    group-advantage options and the bucket minimums (R, S and Nb are powers of two at least these,
    so the jitted step compiles once per bucket)."""

    num_moe_layers: int                  # L_moe of `replay_indices`
    experts_per_tok: int                 # k of `replay_indices`
    pad_id: int                          # fills the token positions past each row's tokens
    std_normalize: bool = False          # `losses.group_advantages` options
    std_unbiased: bool = True
    adv_std_eps: float = 1e-6
    min_rows: int = 8                    # bucket minimums of R, S and Nb
    min_seq: int = 64
    min_groups: int = 1
    max_seq: int | None = None           # refuse a longer segment (the model's context)
    truncated_reasons: tuple[str, ...] = DEFAULT_TRUNCATED_REASONS   # end reasons flagged `truncated`

    def __post_init__(self):
        object.__setattr__(self, "num_moe_layers", int(self.num_moe_layers))
        object.__setattr__(self, "experts_per_tok", int(self.experts_per_tok))
        object.__setattr__(self, "truncated_reasons", tuple(self.truncated_reasons))


def batch_config(cfg) -> BatchConfig:
    """The `BatchConfig` of the full config (`c.model`, `c.rl`, `c.rl.batch`; pad id from its tokenizer)."""
    m, rl = cfg.model, cfg.rl
    return BatchConfig(
        num_moe_layers=transformer.layer_counts(m)[1], experts_per_tok=m.num_experts_per_tok,
        pad_id=tokenizer_from_config(cfg).pad_id,
        std_normalize=bool(rl.std_normalize), std_unbiased=bool(rl.std_unbiased), adv_std_eps=float(rl.adv_std_eps),
        min_rows=int(rl.batch.min_rows), min_seq=int(rl.batch.min_seq), min_groups=int(rl.batch.min_groups),
        max_seq=int(m.max_seq_len), truncated_reasons=tuple(rl.batch.truncated_reasons))


def _checked_rewards(groups: Sequence[Sequence], rewards) -> np.ndarray:
    """`rewards` as a finite float32 ``[groups, G]`` array, the groups all of one size G >= 1."""
    if not groups:
        raise ValueError("need at least one group")
    G = len(groups[0])
    if G < 1 or any(len(g) != G for g in groups):
        raise ValueError(f"all groups must have the same size >= 1, got {[len(g) for g in groups]}")
    rew = np.asarray(rewards, np.float32)
    if rew.shape != (len(groups), G):
        raise ValueError(f"rewards shape {rew.shape} != (groups, group_size) = {(len(groups), G)}")
    if not np.isfinite(rew).all():
        raise ValueError("rewards must be finite")
    return rew


def _segment_rows(groups: Sequence[Sequence], truncated_reasons: tuple[str, ...]) -> list[tuple]:
    """One (group, chain id, segment index, Segment, truncated) per trainer row, in chain order."""
    G = len(groups[0])
    segs = []
    for gi, group in enumerate(groups):
        for j, traj in enumerate(group):
            if not traj.segments:
                raise ValueError(f"chain ({gi}, {j}) of task {traj.task_id!r} has no segments")
            trunc = traj.end_reason in truncated_reasons
            for si, seg in enumerate(traj.segments):
                segs.append((gi, gi * G + j, si, seg, trunc))
    return segs


def _empty_rows(R: int, S: int, c: BatchConfig) -> dict[str, np.ndarray]:
    """The row arrays of `R` x `S` padding (module docstring); replay as ``[L, R, S, k]``."""
    L, k = c.num_moe_layers, c.experts_per_tok
    return dict(
        tokens=np.full((R, S), c.pad_id, np.int32), valid=np.zeros((R, S), bool), loss_mask=np.zeros((R, S), bool),
        sampler_logprobs=np.zeros((R, S), np.float32), policy_versions=np.full((R, S), -1, np.int32),
        replay_indices=np.full((L, R, S, k), -1, np.int32), row_chain=np.full((R,), -1, np.int32),
        row_segment=np.zeros((R,), np.int32), row_group=np.full((R,), -1, np.int32),
        truncated=np.zeros((R,), bool))


def _fill_row(out: dict[str, np.ndarray], r: int, row: tuple, c: BatchConfig) -> None:
    """Write segment row `row` (`_segment_rows`) into row `r` of `out` (`_empty_rows`), checking
    its per-token arrays are aligned to its tokens."""
    gi, ci, si, seg, trunc = row
    L, k = c.num_moe_layers, c.experts_per_tok
    toks = np.asarray(seg.tokens, np.int32).reshape(-1)
    n = len(toks)
    mask = np.asarray(seg.loss_mask, bool).reshape(-1)
    lps = np.asarray(seg.logprobs, np.float32).reshape(-1)
    if mask.shape != (n,) or lps.shape != (n,):
        raise ValueError(f"segment {si} of chain {ci}: loss_mask/logprobs not aligned to {n} tokens")
    if n and mask[0]:
        raise ValueError(f"segment {si} of chain {ci}: token 0 cannot be model-generated (no context)")
    out["tokens"][r, :n] = toks
    out["valid"][r, :n] = True
    out["loss_mask"][r, :n] = mask
    out["sampler_logprobs"][r, :n] = np.where(mask, lps, 0.0)
    if seg.policy_versions is not None:
        out["policy_versions"][r, :n] = np.where(mask, np.asarray(seg.policy_versions, np.int32).reshape(-1), -1)
    if seg.router_indices is not None and L > 0:
        ri = np.asarray(seg.router_indices, np.int32)
        if ri.shape != (L, n, k):
            raise ValueError(f"segment {si} of chain {ci}: router_indices shape {ri.shape} != {(L, n, k)}")
        out["replay_indices"][:, r, :n] = ri
    out["row_chain"][r], out["row_segment"][r], out["row_group"][r], out["truncated"][r] = ci, si, gi, trunc


def _advantage_fields(rew: np.ndarray, row_chain: np.ndarray, Nb: int, c: BatchConfig) -> dict[str, np.ndarray]:
    """The per-row advantages and the group-level arrays (padded to `Nb` groups) of rewards
    ``[groups, G]``: Dr.GRPO chain advantages per prompt, broadcast to each chain's rows."""
    G = rew.shape[1]
    chain_adv = np.asarray(losses.group_advantages(rew, std_normalize=c.std_normalize, std_unbiased=c.std_unbiased,
                                                   eps=c.adv_std_eps),
                           np.float32).reshape(-1)
    advantages = np.asarray(losses.broadcast_chain_advantages(chain_adv, row_chain), np.float32)
    group_rewards = np.zeros((Nb, G), np.float32)
    group_rewards[: len(rew)] = rew
    group_valid = np.zeros((Nb,), bool)
    group_valid[: len(rew)] = True
    chain_adv_b = np.zeros((Nb * G,), np.float32)
    chain_adv_b[: chain_adv.size] = chain_adv
    return dict(advantages=advantages, chain_advantages=chain_adv_b, group_rewards=group_rewards,
                group_valid=group_valid)


def build_batch(
    groups: Sequence[Sequence],
    rewards: Sequence[Sequence[float]] | np.ndarray,
    config: BatchConfig,
) -> dict[str, np.ndarray]:
    """Lay out groups of chains as padded trainer rows (module docstring; docs/SPEC.md §4), with
    the shapes and advantage options of `config`."""
    rew = _checked_rewards(groups, rewards)
    segs = _segment_rows(groups, config.truncated_reasons)
    longest = max(len(s[3].tokens) for s in segs)
    if config.max_seq is not None and longest > config.max_seq:
        raise ValueError(f"a segment has {longest} tokens > max_seq={config.max_seq}")
    R, S = bucket(len(segs), config.min_rows), bucket(longest, config.min_seq)
    Nb = bucket(len(groups), config.min_groups)
    out = _empty_rows(R, S, config)
    for r, row in enumerate(segs):
        _fill_row(out, r, row, config)
    L, k = config.num_moe_layers, config.experts_per_tok
    out["replay_indices"] = out["replay_indices"].reshape(L, R * S, k)
    out.update(_advantage_fields(rew, out["row_chain"], Nb, config))
    return {name: out[name] for name in BATCH_FIELDS}


# per-row fields (leading axis = rows; `replay_indices` is [L, R*S, k]) and their padding-row values
ROW_FIELDS = dict(tokens=None, valid=False, loss_mask=False, sampler_logprobs=0.0, policy_versions=-1,
                  advantages=0.0, row_chain=-1, row_segment=0, row_group=-1, truncated=False)


def split_microbatches(batch: dict[str, np.ndarray], micro_rows: int, *, pad_id: int) -> dict[str, np.ndarray]:
    """`build_batch`'s rows regrouped into M micro-batches of `micro_rows` rows each, stacked on a
    new leading axis ([M, micro_rows, S], replay [M, L, micro_rows*S, k]), for the trainer's
    gradient accumulation (`horizon.rl.algo.trainer`): the step's activation memory then scales with
    `micro_rows`, not with the whole batch.

    Whole chains go to one micro-batch, so the KL reward-to-go across a chain's segments
    (`rl.kl_across_segments`) sees all of them; a chain with more than `micro_rows` segments is
    refused. Chains are placed first-fit, longest segment first (ties in chain order), so a
    micro-batch holds rows of similar length and the trainer can cut it to a short length bucket
    (`horizon.rl.algo.accumulate`). The group fields (`chain_advantages`, `group_rewards`,
    `group_valid`) stay whole. M is the number of bins needed: the trainer loops over them."""
    if micro_rows < 1:
        raise ValueError(f"micro_rows must be >= 1, got {micro_rows}")
    rc = np.asarray(batch["row_chain"])
    chains: dict[int, list[int]] = {}
    for r in np.flatnonzero(rc >= 0):
        chains.setdefault(int(rc[r]), []).append(int(r))
    lengths = np.asarray(batch["valid"]).sum(axis=-1)
    order = sorted(chains, key=lambda ci: -int(max(lengths[r] for r in chains[ci])))   # stable: ties by chain
    bins: list[list[int]] = []
    for ci in order:
        rows = chains[ci]
        if len(rows) > micro_rows:
            raise ValueError(f"chain {ci} has {len(rows)} segments > micro_rows={micro_rows}: raise "
                             "rl.batch.micro_rows (a chain's segments must share a micro-batch)")
        for b in bins:
            if len(b) + len(rows) <= micro_rows:
                b += rows
                break
        else:
            bins.append(list(rows))
    bins = bins or [[]]
    R, S = batch["tokens"].shape
    idx = np.full((len(bins), micro_rows), R, np.int64)            # R = the appended padding row
    for i, b in enumerate(bins):
        idx[i, :len(b)] = b
    out = {}
    for name, fill in ROW_FIELDS.items():
        x = np.asarray(batch[name])
        pad = np.full((1,) + x.shape[1:], pad_id if fill is None else fill, x.dtype)
        out[name] = np.concatenate([x, pad])[idx]
    rep = np.asarray(batch["replay_indices"])
    L, _, k = rep.shape
    rep = np.concatenate([rep.reshape(L, R, S, k), np.full((L, 1, S, k), -1, rep.dtype)], axis=1)
    out["replay_indices"] = np.moveaxis(rep[:, idx], 0, 1).reshape(len(bins), L, micro_rows * S, k)
    out.update({k_: batch[k_] for k_ in batch if k_ not in out})
    return out


def batch_shapes(rows: int, seq: int, *, groups: int, group_size: int, num_moe_layers: int, experts_per_tok: int,
                 micro_rows: int = 0, microbatches: int = 1) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{field: (shape, dtype)} of `build_batch`'s arrays for R = `rows`, S = `seq`, Nb = `groups`
    (bucketed sizes, as `build_batch` makes them), or with `micro_rows` > 0 of `split_microbatches`'
    M = `microbatches` micro-batches of that many rows: the abstract batch of a step that has not
    run yet (`horizon.rl.runtime.memory`; tests/rl/test_batch.py checks it against real batches)."""
    L, k, G = int(num_moe_layers), int(experts_per_tok), int(group_size)
    lead = (int(microbatches), int(micro_rows)) if micro_rows > 0 else (int(rows),)
    n = int(np.prod(lead[-1:])) * int(seq)
    i32, f32, b8 = np.dtype(np.int32), np.dtype(np.float32), np.dtype(bool)
    out = {name: (lead + (int(seq),), dt) for name, dt in
           (("tokens", i32), ("valid", b8), ("loss_mask", b8), ("sampler_logprobs", f32), ("policy_versions", i32))}
    out.update({name: (lead, dt) for name, dt in (("advantages", f32), ("row_chain", i32), ("row_segment", i32),
                                                   ("row_group", i32), ("truncated", b8))})
    out["replay_indices"] = (lead[:-1] + (L, n, k), i32)
    out.update(chain_advantages=((int(groups) * G,), f32), group_rewards=((int(groups), G), f32),
               group_valid=((int(groups),), b8))
    return out


def permute_rows(batch: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """`batch` with its rows in `order` (``[R]``, or ``[M, r]`` for a split batch: each micro-batch's
    rows permuted within it), replay indices moved with their rows; group-level fields unchanged.
    The RL loss sums over rows and reads chain / segment ids from the row fields, so it is
    row-order invariant (global sequence packing, `horizon.parallel.packing.balanced_row_order`)."""
    order = np.asarray(order, np.int64)
    split = batch["tokens"].ndim == 3
    out = dict(batch)
    for name in ROW_FIELDS:
        x = np.asarray(batch[name])
        idx = order.reshape(order.shape + (1,) * (x.ndim - order.ndim))
        out[name] = np.take_along_axis(x, idx, axis=order.ndim - 1)
    rep = np.asarray(batch["replay_indices"])
    R, S = batch["tokens"].shape[-2:]
    if split:
        M, L, _, k = rep.shape
        r = rep.reshape(M, L, R, S, k)
        out["replay_indices"] = np.stack([r[m][:, order[m]] for m in range(M)]).reshape(rep.shape)
    else:
        L, _, k = rep.shape
        out["replay_indices"] = rep.reshape(L, R, S, k)[:, order].reshape(rep.shape)
    return out


def build_batch_from_config(groups, rewards, cfg) -> dict[str, np.ndarray]:
    """`build_batch` with `batch_config(cfg)` (the full config: `c.model`, `c.rl`, `c.rl.batch`);
    split into micro-batches of `rl.batch.micro_rows` rows when that is > 0."""
    c = batch_config(cfg)
    b = build_batch(groups, rewards, c)
    micro = int(cfg.rl.batch.get("micro_rows", 0) or 0)
    return split_microbatches(b, micro, pad_id=c.pad_id) if micro > 0 else b


def batch_stats(batch: dict[str, np.ndarray]) -> dict[str, float]:
    """Host-side summary of a batch, whole or split (for logs): rows, tokens, padding waste, staleness."""
    rows = int((batch["row_chain"] >= 0).sum())
    vers = batch["policy_versions"][batch["loss_mask"]]
    return dict(rows=rows, generated_tokens=int(batch["loss_mask"].sum()), tokens=int(batch["valid"].sum()),
                fill=float(batch["valid"].mean()),
                min_policy_version=int(vers.min()) if vers.size else -1,
                max_policy_version=int(vers.max()) if vers.size else -1)
