"""RL losses: group advantages, Dr.GRPO policy gradient, KL(q||p) estimators (docs/SPEC.md §4).

Conventions (used everywhere in this module):

* ``q`` is the policy being trained (its log-probs are ``logprobs``, differentiable) and
  the distribution the tokens were sampled from (up to the sampler/trainer mismatch
  handled by the importance ratio). ``p`` is the frozen reference policy
  (``ref_logprobs``, constant). The regulariser is ``KL(q || p) = E_{x~q}[-log r(x)]``
  with ``r = p / q``, i.e. ``log r = ref_logprobs - logprobs``.
* KL estimators of one sample (Schulman's naming):
  ``k1 = -log r``, ``k2 = 0.5 (log r)^2``, ``k3 = (r - 1) - log r``.
  Under ``x ~ q``: ``E[k1] = E[k3] = KL(q||p)`` (unbiased values), ``k2`` is biased.

How the KL enters the gradient (``kl_mode``; docs/SPEC.md §4 caveat). For sequences
``y = (y_1..y_T) ~ q`` the exact gradient of the sequence-level KL is
``∇KL = E[ Σ_t ∇log q(y_t|y_<t) · Σ_{t'>=t} k1_{t'} ]`` (score function with causal
reward-to-go; the pathwise part ``E[Σ_t ∇k1_t] = E[Σ_t ∇log q_t] = 0`` is dropped).

* ``"reward"`` (default): the *detached* estimator is summed over the current and all
  later valid tokens of the row (reward-to-go; for summary chains optionally also over
  all later segment rows of the same chain) and subtracted from the per-token advantage:
  ``A_t = A - β · stopgrad(Σ_{t'>=t} k_{t'})``. With ``k1`` its expected gradient is
  exactly ``β ∇KL(q||p)`` (tested on a categorical and a two-step policy). With ``k2``/
  ``k3`` this mode is biased (their score-function gradient is not ∇KL).
* ``"reward_token"``: same but with the per-token penalty only, ``A_t = A - β·sg(k_t)``.
  With ``k1`` this is ``Σ_t ∇_θ KL(q(·|y_<t) || p(·|y_<t))`` with the prefix distribution
  held fixed: exact for one-step (bandit) policies, biased for the sequence KL (it
  ignores how earlier tokens change later KL terms); lower variance.
* ``"loss"`` (ablation, the naive form): ``β · agg(k_t)`` added to the loss as a plain
  differentiable term. Expected gradients under ``x ~ q``: ``k1`` → **zero**
  (``E_q[∇log q] = 0``), ``k3`` → ``∇KL(p||q)`` (the *other* KL), ``k2`` →
  ``E_q[k1 ∇log q]`` = the ``"reward_token"``/k1 gradient.

Loss aggregation (``agg``), with per-token surrogate ``s_it`` and valid mask ``m_it``,
``R`` = number of rows (static leading dim) or ``token_sum_norm`` when given:

* ``"token_sum"`` (default, Dr.GRPO): ``-(1/R) Σ_i Σ_t m_it s_it``. No length
  normalisation: a response twice as long gets twice the gradient weight.
* ``"seq_mean"`` (GRPO ablation): ``-(1/#nonempty rows) Σ_i (Σ_t m_it s_it / Σ_t m_it)``.
* ``"token_mean"`` (DAPO ablation): ``-Σ_i Σ_t m_it s_it / Σ_i Σ_t m_it``.

Stale-token corrections (all off by default). Tokens sampled by older policy versions (in-flight
weight updates, a staleness bound > 0) or by a sampler whose numerics differ from the trainer's
make ``r = exp(logprobs - sampler_logprobs)`` drift from 1. Each correction reads the *detached*
``log r`` of the loss tokens and has one cap ``c > 1`` (0 = off):

* truncated importance sampling (``tis_cap``, `tis_weight`; verl's ``tis_imp_ratio_cap``): the
  token's importance weight becomes ``w = min(r, c)`` (detached), i.e. its gradient is
  ``w · A_t · ∇log q`` — the untruncated ``r`` of the plain surrogate is *replaced* by ``w``, not
  multiplied by it (``r · min(r, c)`` would count the ratio twice);
* token masking (``token_mask_cap``, `token_ratio_mask`): a token with ``r`` outside
  ``[1/c, c]`` gets no policy-gradient loss;
* sequence masking (``seq_mask_cap``, `sequence_ratio_mask`): a row whose geometric-mean ratio
  ``exp(mean_t log r)`` over its loss tokens is outside ``[1/c, c]`` gets none.

The corrections act on the per-token surrogate ``s_it`` (whose advantage carries the detached KL
penalty in the ``"reward*"`` KL modes, as verl's KL-in-reward); the KL values themselves (the
penalty's reward-to-go, the ``kl_*`` metrics) and the ``"loss"``-mode KL term are unchanged. A
masked token contributes 0 to the sum but stays in the denominator the aggregation defines (its
row still counts for ``"token_sum"``/``"seq_mean"``, its token for ``"token_mean"`` and its row's
length for ``"seq_mean"``): the normalisation stays a property of the batch, not of the
trainer's current weights, and gradient accumulation (which weights micro-batches by these
counts) stays exact.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from horizon.utils.config import need, need_choice, need_float

KL_ESTIMATORS = ("k1", "k2", "k3")
KL_MODES = ("reward", "reward_token", "loss")
LOSS_AGGS = ("token_sum", "seq_mean", "token_mean")
STALE_CAPS = ("tis_cap", "token_mask_cap", "seq_mask_cap")   # `rl.stale` fields = `LossConfig` fields


# ----------------------------------------------------------------------------- advantages
def mean_group_max(x: Float[Array, "groups k"], valid: Float[Array, " groups"] | None = None) -> Float[Array, ""]:
    """Best-of-K as the report plots it: the mean over groups (prompts, or held-out tasks) of the
    max over the group's K samples (rollouts, or eval passes), over the `valid` groups. With
    0/1 success this is the fraction of groups solved by any of K samples, i.e. pass@K at n = K
    (the unbiased pass@k for k < n is `horizon.eval.harness.pass_at_k`). Works on numpy too."""
    m = x.max(axis=1)
    if valid is None:
        return m.mean()
    return (m * valid).sum() / jnp.maximum(valid.sum(), 1.0)


def group_std(grouped: Float[Array, "groups k"], *, unbiased: bool = True) -> Float[Array, "groups 1"]:
    """Per-group std ``sqrt(Σ (x - mean)^2 / (k - ddof))`` with Bessel's ``ddof = 1`` when `unbiased`
    (``torch.std``'s default, hence verl's and TRL's GRPO), else the population ``ddof = 0``.
    A group of one has std 0 either way (no division by ``k - ddof = 0``)."""
    k = grouped.shape[1]
    ddof = int(unbiased)
    dev = grouped - grouped.mean(axis=1, keepdims=True)
    return jnp.sqrt(jnp.sum(dev * dev, axis=1, keepdims=True) / max(k - ddof, 1))


def group_advantages(
    rewards: Float[Array, " n"] | Float[Array, "groups group_size"],
    *,
    group_size: int | None = None,
    std_normalize: bool = False,
    std_unbiased: bool = True,
    eps: float = 1e-6,
) -> Float[Array, " n"] | Float[Array, "groups group_size"]:
    """Reward minus its group mean (docs/SPEC.md §4, Dr.GRPO); same shape as ``rewards``.

    ``rewards`` is ``[groups, group_size]`` or flat ``[groups*group_size]`` (consecutive
    entries form a group; then ``group_size`` is required). ``std_normalize`` divides by
    the group std (+``eps``): original GRPO, kept only as an ablation because it
    over-weights tiny differences in groups that are all equally correct. The std is
    `group_std`: unbiased (verl's ``(r - mean) / (torch.std + eps)``) unless
    ``std_unbiased=False`` (population). A group of one gets advantage 0 (verl instead
    passes its raw reward through), as does any group whose std and ``eps`` are both 0.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    flat = rewards.ndim == 1
    if flat:
        if group_size is None or group_size <= 0:
            raise ValueError("flat rewards need a positive group_size")
        if rewards.shape[0] % group_size:
            raise ValueError(f"{rewards.shape[0]} rewards not divisible by group_size={group_size}")
        grouped = rewards.reshape(-1, group_size)
    elif rewards.ndim == 2:
        if group_size is not None and group_size != rewards.shape[1]:
            raise ValueError(f"group_size={group_size} but rewards have shape {rewards.shape}")
        grouped = rewards
    else:
        raise ValueError(f"rewards must be 1-D or 2-D, got shape {rewards.shape}")
    adv = grouped - grouped.mean(axis=1, keepdims=True)
    if std_normalize:
        denom = group_std(grouped, unbiased=std_unbiased) + eps
        adv = adv / jnp.where(denom > 0, denom, 1.0)  # denom 0 -> every deviation is 0 -> advantage 0
    return adv.reshape(rewards.shape)


def broadcast_chain_advantages(
    chain_adv: Float[Array, " chains"], row_chain_index: Int[Array, " rows"]
) -> Float[Array, " rows"]:
    """Give every segment row of a summary chain its chain's advantage (docs/SPEC.md §4, §6).

    A chain (generations joined by self-summaries) has one reward; its advantage is
    computed per prompt over whole chains (``group_advantages`` on chain rewards). Each
    segment is packed as its own row; ``row_chain_index[i]`` names the chain of row ``i``.
    Index ``-1`` marks padding rows, which get advantage 0.
    """
    chain_adv = jnp.asarray(chain_adv, jnp.float32)
    idx = jnp.asarray(row_chain_index)
    if chain_adv.ndim != 1 or idx.ndim != 1:
        raise ValueError(f"need 1-D inputs, got {chain_adv.shape} and {idx.shape}")
    if not jnp.issubdtype(idx.dtype, jnp.integer):
        raise ValueError(f"row_chain_index must be integer, got {idx.dtype}")
    if not isinstance(idx, jax.core.Tracer):
        if idx.size and (int(idx.max()) >= chain_adv.shape[0] or int(idx.min()) < -1):
            raise ValueError(
                f"row_chain_index out of range [-1, {chain_adv.shape[0]}): "
                f"min {int(idx.min())}, max {int(idx.max())}")
    safe = jnp.clip(idx, 0, max(chain_adv.shape[0] - 1, 0))
    return jnp.where(idx >= 0, chain_adv[safe], 0.0)


# ----------------------------------------------------------------------------- KL estimators
def kl_estimate(
    logq: Float[Array, "*shape"], logp: Float[Array, "*shape"], estimator: str = "k1"
) -> Float[Array, "*shape"]:
    """Per-sample estimator of KL(q||p) for samples x ~ q, r = p/q (docs/SPEC.md §4).

    ``k1 = -log r`` (unbiased, the report's choice), ``k2 = ½(log r)²`` (biased, low
    variance), ``k3 = (r-1) - log r`` (unbiased, low variance only while p ≈ q; its
    variance explodes as they diverge — experiments/kl_estimators.py).
    """
    log_r = logp - logq
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * jnp.square(log_r)
    if estimator == "k3":
        return jnp.expm1(log_r) - log_r
    raise ValueError(f"unknown kl_estimator {estimator!r}; choose from {KL_ESTIMATORS}")


def _reverse_cumsum(x: Float[Array, "rows seq"]) -> Float[Array, "rows seq"]:
    """out[:, t] = Σ_{t' >= t} x[:, t']."""
    return jnp.flip(jnp.cumsum(jnp.flip(x, axis=1), axis=1), axis=1)


def later_segments_sum(
    row_values: Float[Array, " rows"],
    row_chain_index: Int[Array, " rows"],
    row_segment_index: Int[Array, " rows"],
) -> Float[Array, " rows"]:
    """For each row, the sum of ``row_values`` over later segments of the same chain.

    Used for the KL reward-to-go across summary-chain segments (docs/SPEC.md §4): tokens of an
    early segment influence every later segment, so they are charged the later KL too.
    Rows with chain index ``-1`` (padding) get and contribute 0. O(rows²) mask — rows per
    step are small (thousands at most).
    """
    c = jnp.asarray(row_chain_index)
    s = jnp.asarray(row_segment_index)
    later = (c[None, :] == c[:, None]) & (s[None, :] > s[:, None]) & (c[None, :] >= 0) & (c[:, None] >= 0)
    return jnp.sum(jnp.where(later, row_values[None, :], 0.0), axis=1)


# ----------------------------------------------------------------------------- aggregation
def aggregate(
    values: Float[Array, "rows seq"],
    mask: Float[Array, "rows seq"],
    agg: str = "token_sum",
    *,
    token_sum_norm: float | None = None,
) -> Float[Array, ""]:
    """Reduce per-token values to a scalar (definitions in the module docstring, docs/SPEC.md §4)."""
    mask = mask.astype(values.dtype)
    if agg == "token_sum":
        norm = values.shape[0] if not token_sum_norm else token_sum_norm
        if norm <= 0:
            raise ValueError(f"token_sum_norm must be > 0, got {token_sum_norm}")
        return jnp.sum(values * mask) / norm
    if agg == "seq_mean":
        tok = mask.sum(axis=1)
        per_row = jnp.sum(values * mask, axis=1) / jnp.maximum(tok, 1.0)
        nonempty = (tok > 0).astype(values.dtype)
        return jnp.sum(per_row * nonempty) / jnp.maximum(nonempty.sum(), 1.0)
    if agg == "token_mean":
        return jnp.sum(values * mask) / jnp.maximum(mask.sum(), 1.0)
    raise ValueError(f"unknown loss_agg {agg!r}; choose from {LOSS_AGGS}")


# ----------------------------------------------------------------------------- stale tokens
def check_stale_cap(name: str, cap: float | None) -> float:
    """A stale-token cap as a float: 0 (or None) = off, else it must be > 1."""
    c = float(cap or 0.0)
    if c != 0.0 and not c > 1.0:
        raise ValueError(f"{name} must be 0 (off) or > 1, got {cap}")
    return c


def tis_weight(
    log_ratio: Float[Array, "rows seq"], cap: float
) -> tuple[Float[Array, "rows seq"], Bool[Array, "rows seq"]]:
    """Truncated importance sampling (verl's ``tis_imp_ratio_cap``): the detached
    per-token weight ``min(exp(log_ratio), cap)`` and where it was capped (``ratio > cap``).
    ``log_ratio = logprobs - sampler_logprobs``; computed in log space (no overflow)."""
    lr = jax.lax.stop_gradient(log_ratio)
    log_c = math.log(check_stale_cap("tis_cap", cap))
    return jnp.exp(jnp.minimum(lr, log_c)), lr > log_c


def token_ratio_mask(log_ratio: Float[Array, "rows seq"], cap: float) -> Bool[Array, "rows seq"]:
    """Token masking: True where the token's ratio ``exp(log_ratio)`` lies in
    ``[1/cap, cap]`` (kept), False where it leaves the band (no policy-gradient loss)."""
    log_c = math.log(check_stale_cap("token_mask_cap", cap))
    return jnp.abs(jax.lax.stop_gradient(log_ratio)) <= log_c


def sequence_ratio_mask(
    log_ratio: Float[Array, "rows seq"], mask: Float[Array, "rows seq"], cap: float
) -> Bool[Array, " rows"]:
    """Sequence masking: True for a row (one sequence / chain segment) whose
    geometric-mean ratio ``exp(Σ_t m_t log_ratio_t / Σ_t m_t)`` over its loss tokens lies in
    ``[1/cap, cap]``; False = the row is dropped from the policy-gradient loss. A row without loss
    tokens has mean 0 (kept; it contributes nothing anyway)."""
    log_c = math.log(check_stale_cap("seq_mask_cap", cap))
    m = mask.astype(jnp.float32)
    mean = jnp.sum(jax.lax.stop_gradient(log_ratio) * m, axis=1) / jnp.maximum(m.sum(axis=1), 1.0)
    return jnp.abs(mean) <= log_c


# ----------------------------------------------------------------------------- loss config
@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The static options of `policy_gradient_loss` (docs/SPEC.md §4; module docstring): one frozen,
    hashable value built once from the config (`loss_config`), so the jitted step that closes over
    it compiles once per config. Checked on construction (ValueError); the stale-token caps are
    stored as floats (None = 0 = off)."""

    agg: str = "token_sum"                    # "token_sum" | "seq_mean" | "token_mean"
    token_sum_norm: float | None = None       # "token_sum" divisor; None / 0 = the number of rows
    clip_eps: float | None = None             # PPO ratio clip; None / 0 = off
    overlong_mask: bool = False               # drop the rows flagged `truncated`
    kl_coef: float = 0.0                      # β; 0 = no KL
    kl_estimator: str = "k1"                  # `KL_ESTIMATORS`
    kl_mode: str = "reward"                   # `KL_MODES`
    tis_cap: float | None = 0.0               # stale-token caps (`STALE_CAPS`): 0 = off, else > 1
    token_mask_cap: float | None = 0.0
    seq_mask_cap: float | None = 0.0

    def __post_init__(self):
        if self.agg not in LOSS_AGGS:
            raise ValueError(f"unknown loss_agg {self.agg!r}; choose from {LOSS_AGGS}")
        if self.kl_mode not in KL_MODES:
            raise ValueError(f"unknown kl_mode {self.kl_mode!r}; choose from {KL_MODES}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown kl_estimator {self.kl_estimator!r}; choose from {KL_ESTIMATORS}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.clip_eps is not None and self.clip_eps < 0:
            raise ValueError(f"clip_eps must be >= 0 or None, got {self.clip_eps}")
        for name in STALE_CAPS:
            object.__setattr__(self, name, check_stale_cap(name, getattr(self, name)))


def loss_config(rl_cfg) -> LossConfig:
    """The `LossConfig` of the ``c.rl`` config section (configs/rl_tiny.py; caps from ``rl.stale``)."""
    return LossConfig(
        agg=rl_cfg.loss_agg,
        token_sum_norm=rl_cfg.token_sum_norm or None,
        clip_eps=rl_cfg.clip_eps or None,
        overlong_mask=bool(rl_cfg.overlong_mask),
        kl_coef=float(rl_cfg.kl_coef),
        kl_estimator=rl_cfg.kl_estimator,
        kl_mode=rl_cfg.kl_mode,
        **{k: float(rl_cfg.stale[k]) for k in STALE_CAPS},
    )


def validate_loss_config(rl_cfg) -> None:
    """The loss fields of the ``c.rl`` config section, as one `ConfigError` line each (the RL
    drivers' config check, `horizon.rl.runtime.checks.validate_rl`)."""
    r = rl_cfg
    need_choice(r, "loss_agg", "rl", LOSS_AGGS)
    need_float(r, "token_sum_norm", "rl", 0.0)
    if r.clip_eps is not None:
        need_float(r, "clip_eps", "rl", 0.0)
    need_float(r, "kl_coef", "rl", 0.0)
    need_choice(r, "kl_estimator", "rl", KL_ESTIMATORS)
    need_choice(r, "kl_mode", "rl", KL_MODES)
    for k in STALE_CAPS:              # 0 = off, else a ratio cap > 1
        v = need_float(r.stale, k, "rl.stale", 0.0)
        need(v == 0.0 or v > 1.0, f"rl.stale.{k}", r.stale[k], "must be 0 (off) or > 1 (a cap on the ratio)")


# ----------------------------------------------------------------------------- policy gradient
def _check_inputs(
    logprobs: Float[Array, "rows seq"],
    sampler_logprobs: Float[Array, "rows seq"],
    advantages: Float[Array, " rows"],
    mask: Bool[Array, "rows seq"] | Float[Array, "rows seq"],
    config: LossConfig,
    truncated: Bool[Array, " rows"] | None,
    ref_logprobs: Float[Array, "rows seq"] | None,
    row_chain_index: Int[Array, " rows"] | None,
    row_segment_index: Int[Array, " rows"] | None,
) -> None:
    """Shape and presence checks of `policy_gradient_loss`'s arrays against `config` (ValueError)."""
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be [rows, seq], got {logprobs.shape}")
    for name, x in (("sampler_logprobs", sampler_logprobs), ("mask", mask), ("ref_logprobs", ref_logprobs)):
        if x is not None and x.shape != logprobs.shape:
            raise ValueError(f"{name} shape {x.shape} != logprobs shape {logprobs.shape}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [rows]={logprobs.shape[:1]}, got {advantages.shape}")
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if (row_chain_index is None) != (row_segment_index is None):
        raise ValueError("give both row_chain_index and row_segment_index, or neither")
    if config.overlong_mask:
        if truncated is None:
            raise ValueError("overlong_mask=True needs the per-row `truncated` flags")
        if truncated.shape != logprobs.shape[:1]:
            raise ValueError(f"truncated must be [rows], got {truncated.shape}")


def _ratios(
    logprobs: Float[Array, "rows seq"],
    sampler_logprobs: Float[Array, "rows seq"],
    m: Float[Array, "rows seq"],
    valid: Bool[Array, "rows seq"],
    config: LossConfig,
) -> tuple[Float[Array, "rows seq"], Float[Array, "rows seq"], Bool[Array, "rows seq"] | Bool[Array, "rows 1"] | None,
           Float[Array, "rows seq"]]:
    """(``log r``, ``r``, the tokens the stale-token masks keep in the loss or None with both masks
    off, the surrogate's ratio: ``r``, or 1 at a masked token) of the loss tokens (0 / 1 elsewhere)."""
    log_ratio = jnp.where(valid, logprobs - jax.lax.stop_gradient(sampler_logprobs), 0.0)
    ratio = jnp.exp(log_ratio)
    keep = None
    if config.token_mask_cap:
        keep = token_ratio_mask(log_ratio, config.token_mask_cap)
    if config.seq_mask_cap:
        rows_in = sequence_ratio_mask(log_ratio, m, config.seq_mask_cap)[:, None]
        keep = rows_in if keep is None else keep & rows_in
    # a masked token's surrogate is zeroed later; an overflowing exp there would turn its zero
    # gradient into 0 * inf = NaN
    ratio_s = ratio if keep is None else jnp.exp(jnp.where(keep, log_ratio, 0.0))
    return log_ratio, ratio, keep, ratio_s


def _kl_penalty(
    logprobs: Float[Array, "rows seq"],
    ref_logprobs: Float[Array, "rows seq"],
    adv: Float[Array, "rows seq"],
    m: Float[Array, "rows seq"],
    valid: Bool[Array, "rows seq"],
    config: LossConfig,
    row_chain_index: Int[Array, " rows"] | None,
    row_segment_index: Int[Array, " rows"] | None,
) -> tuple[Float[Array, "rows seq"], Float[Array, ""] | None, dict[str, Any]]:
    """The KL's part of the loss (module docstring, ``kl_mode``): (per-token advantage less the
    detached penalty in the ``"reward*"`` modes, the ``"loss"``-mode term or None, KL metrics)."""
    lq = jnp.where(valid, logprobs, 0.0)
    lp = jnp.where(valid, ref_logprobs, 0.0)
    k = kl_estimate(lq, lp, config.kl_estimator) * m
    k_det = jax.lax.stop_gradient(k)
    metrics = {}
    for name in KL_ESTIMATORS:  # monitoring: mean per valid token
        metrics[f"kl_{name}"] = jax.lax.stop_gradient(
            jnp.sum(kl_estimate(lq, lp, name) * m) / jnp.maximum(m.sum(), 1.0))
    kl_loss = None
    if config.kl_coef > 0:
        if config.kl_mode == "reward":
            pen = _reverse_cumsum(k_det)
            if row_chain_index is not None:
                pen = pen + later_segments_sum(k_det.sum(axis=1), row_chain_index, row_segment_index)[:, None]
            adv = adv - config.kl_coef * pen
        elif config.kl_mode == "reward_token":
            pen = k_det
            adv = adv - config.kl_coef * pen
        else:  # "loss": naive differentiable term (biased gradient for k1/k3)
            pen = jnp.zeros_like(k_det)
            kl_loss = config.kl_coef * aggregate(k, m, config.agg, token_sum_norm=config.token_sum_norm)
        metrics["kl_penalty_mean"] = jnp.sum(pen * m) / jnp.maximum(m.sum(), 1.0)
    return adv, kl_loss, metrics


def _clipped_surrogate(
    ratio_s: Float[Array, "rows seq"],
    ratio: Float[Array, "rows seq"],
    adv: Float[Array, "rows seq"],
    m: Float[Array, "rows seq"],
    clip_eps: float | None,
) -> tuple[Float[Array, "rows seq"], Float[Array, ""]]:
    """(per-token surrogate ``ratio_s · A_t``, PPO-clipped with `clip_eps`, and the fraction of
    loss tokens where the clip binds, judged on the unmasked `ratio`)."""
    surr = ratio_s * adv
    if not clip_eps:
        return surr, jnp.zeros((), jnp.float32)
    clipped = jnp.clip(ratio_s, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    surr = jnp.minimum(surr, clipped)
    binds = ((adv > 0) & (ratio > 1.0 + clip_eps)) | ((adv < 0) & (ratio < 1.0 - clip_eps))
    return surr, jnp.sum(binds * m) / jnp.maximum(m.sum(), 1.0)


def _stale_corrections(
    surr: Float[Array, "rows seq"],
    log_ratio: Float[Array, "rows seq"],
    ratio: Float[Array, "rows seq"],
    m: Float[Array, "rows seq"],
    keep: Bool[Array, "rows seq"] | Bool[Array, "rows 1"] | None,
    tis_cap: float,
) -> tuple[Float[Array, "rows seq"], dict[str, Float[Array, ""]]]:
    """`surr` with the TIS weight and the stale-token masks applied (module docstring), and the
    ``stale/*`` metrics (logged whether or not a correction is on)."""
    n_loss = jnp.maximum(m.sum(), 1.0)
    capped = jnp.zeros_like(m, dtype=bool)
    if tis_cap:
        # weight w = min(r, c) *replaces* the untruncated r: s * sg(w / r), w / r = exp(min(0, log c - log r));
        # value w·A_t, gradient w·A_t·∇log q (a clip-bound token keeps its zero gradient)
        _, capped = tis_weight(log_ratio, tis_cap)
        surr = surr * jnp.exp(jnp.minimum(0.0, math.log(tis_cap) - jax.lax.stop_gradient(log_ratio)))
    if keep is not None:
        surr = jnp.where(keep, surr, 0.0)         # 0 in the sum, still in the denominator (module docstring)
    metrics = {
        "stale/masked_token_fraction":
            jnp.zeros((), jnp.float32) if keep is None else jnp.sum(jnp.where(keep, 0.0, m)) / n_loss,
        "stale/tis_clipped_fraction": jnp.sum(capped * m) / n_loss,
        "stale/mean_ratio": jnp.sum(ratio * m) / n_loss,
    }
    return surr, metrics


def policy_gradient_loss(
    logprobs: Float[Array, "rows seq"],
    sampler_logprobs: Float[Array, "rows seq"],
    advantages: Float[Array, " rows"],
    mask: Bool[Array, "rows seq"] | Float[Array, "rows seq"],
    config: LossConfig = LossConfig(),
    *,
    truncated: Bool[Array, " rows"] | None = None,
    ref_logprobs: Float[Array, "rows seq"] | None = None,
    row_chain_index: Int[Array, " rows"] | None = None,
    row_segment_index: Int[Array, " rows"] | None = None,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """Dr.GRPO policy-gradient loss with importance ratio, optional PPO clip, KL and stale-token
    corrections, as `config` sets them (docs/SPEC.md §4; the formulas are in the module docstring).

    The ratio is ``exp(logprobs - stopgrad(sampler_logprobs))``: the trainer against the
    sampler's own log-probs, so in-flight / mixed-version rollouts are corrected. `mask` marks
    the trained (model-generated) tokens; `truncated` flags rows for ``config.overlong_mask``;
    `ref_logprobs` is the frozen reference (needed when ``config.kl_coef > 0``, else it only
    feeds the ``kl_*`` metrics); `row_chain_index` / `row_segment_index` (both or neither)
    extend the KL reward-to-go over later segments of a summary chain.

    Returns ``(loss, metrics)``, every metric a detached scalar.
    """
    _check_inputs(logprobs, sampler_logprobs, advantages, mask, config, truncated, ref_logprobs,
                  row_chain_index, row_segment_index)
    m = mask.astype(jnp.float32)
    if config.overlong_mask:
        m = m * (~truncated.astype(bool))[:, None].astype(jnp.float32)
    valid = m > 0

    log_ratio, ratio, keep, ratio_s = _ratios(logprobs, sampler_logprobs, m, valid, config)

    adv = jnp.broadcast_to(advantages.astype(jnp.float32)[:, None], logprobs.shape)
    metrics: dict[str, Any] = {}
    kl_loss = jnp.zeros((), jnp.float32)
    if ref_logprobs is not None:
        adv, kl_term, metrics = _kl_penalty(logprobs, ref_logprobs, adv, m, valid, config, row_chain_index,
                                            row_segment_index)
        kl_loss = kl_loss if kl_term is None else kl_term

    surr, metrics["clip_frac"] = _clipped_surrogate(ratio_s, ratio, adv, m, config.clip_eps)
    surr, stale = _stale_corrections(surr, log_ratio, ratio, m, keep, config.tis_cap)
    metrics.update(stale)

    pg_loss = -aggregate(surr, m, config.agg, token_sum_norm=config.token_sum_norm)
    loss = pg_loss + kl_loss
    ntok = m.sum()
    metrics.update(
        loss=loss,
        pg_loss=pg_loss,
        kl_loss=kl_loss,
        num_tokens=ntok,
        ratio_mean=jnp.sum(ratio * m) / jnp.maximum(ntok, 1.0),
        ratio_max=jnp.max(jnp.where(valid, ratio, 0.0)),
        adv_mean=jnp.mean(advantages),
        adv_abs_mean=jnp.mean(jnp.abs(advantages)),
    )
    metrics = {k_: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k_, v in metrics.items()}
    return loss, metrics
