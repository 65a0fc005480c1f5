"""Reward shaping: nonlinear length penalty and pluggable behaviour rewards (docs/SPEC.md §4).

Length penalty. The effort ``x`` of a rollout is a weighted sum of its stats
(``cfg.weights``): thinking tokens, tool-call tokens, tool-output tokens, final-message
tokens, number of tool calls and number of turns. The penalty is ``scale · f(x; k, q)``
with the concave-down, increasing curve

    f(x; k, q) = ((1 + k·x)^(1-q) - 1) / (k·(1-q))      for q ≠ 1,
    f(x; k, 1) = log(1 + k·x) / k                         (the q → 1 limit),

for ``x >= 0``, ``k > 0``, ``q >= 0``. Then ``f(0) = 0``, ``f'(x) = (1+kx)^(-q) > 0``
(increasing; slope 1 at x = 0 for every k, q) and ``f''(x) = -q·k·(1+kx)^(-q-1)``, so
f is strictly concave for ``q > 0`` (``q = 0`` is the linear penalty ``x``). ``k`` sets
where the curve bends (x ≈ 1/k), ``q`` how hard: ``q < 1`` grows like x^(1-q),
``q = 1`` logarithmically, ``q > 1`` saturates at ``1/(k(q-1))``. Early effort is charged
the most — each extra tool call on an easy task costs more than on a long-horizon one —
which is what the report's figure 6 shows (experiments/length_penalty_curves.py).

Behaviour rewards. ``BEHAVIOUR_HOOKS`` maps a name to ``hook(stats) -> float``, a *signed*
reward contribution (penalties return values <= 0). ``cfg.behaviour`` maps hook names to
weights; ``total_reward`` adds ``Σ weight · hook(stats)``. Register new hooks with
``register_behaviour_hook``.

Stats dict keys (produced by the agent loop): `horizon.agent.stats.STATS_KEYS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import jax.numpy as jnp
from jaxtyping import Array, Float

from horizon.agent.stats import STATS_KEYS

# Stats entering the effort x, and the name of their weight in cfg.weights.
EFFORT_WEIGHTS = {
    "thinking_tokens": "thinking",
    "tool_call_tokens": "tool_call",
    "tool_output_tokens": "tool_output",
    "final_tokens": "final",
    "tool_calls": "tool_calls",
    "turns": "turns",
}


# ----------------------------------------------------------------------------- length penalty
def validate_curve_params(k: float, q: float) -> None:
    """Raise ValueError unless ``k > 0`` and ``q >= 0`` (where f is increasing and concave)."""
    if not (isinstance(k, (int, float)) and math.isfinite(k) and k > 0):
        raise ValueError(f"length penalty k must be a finite number > 0, got {k!r}")
    if not (isinstance(q, (int, float)) and math.isfinite(q) and q >= 0):
        raise ValueError(f"length penalty q must be a finite number >= 0, got {q!r}")


def penalty_curve(x: Float[Array, "*shape"], k: float, q: float) -> Float[Array, "*shape"]:
    """f(x; k, q) from the module docstring (docs/SPEC.md §4); x is clamped at 0."""
    validate_curve_params(k, q)
    x = jnp.asarray(x, jnp.float32)
    x = jnp.where(x < 0, 0.0, x)  # clamp; keeps the right derivative (1) at x = 0
    kx = k * x
    if q == 1.0:
        return jnp.log1p(kx) / k
    # expm1((1-q)·log1p(kx)) keeps precision for small kx and for q near 1.
    return jnp.expm1((1.0 - q) * jnp.log1p(kx)) / (k * (1.0 - q))


def _check_weights(cfg) -> None:
    missing = [w for w in EFFORT_WEIGHTS.values() if w not in cfg.weights]
    if missing:
        raise ValueError(f"length_penalty.weights lacks {missing}")
    bad = {w: cfg.weights[w] for w in EFFORT_WEIGHTS.values() if cfg.weights[w] < 0}
    if bad:
        raise ValueError(f"length_penalty.weights must be >= 0, got {bad}")
    if cfg.scale < 0:
        raise ValueError(f"length_penalty.scale must be >= 0, got {cfg.scale}")


def effort(stats: Mapping[str, float | Array], cfg) -> Float[Array, "*batch"]:
    """Weighted effort x (docs/SPEC.md §4); works on scalars or on arrays of per-rollout stats."""
    _check_weights(cfg)
    missing = [s for s in EFFORT_WEIGHTS if s not in stats]
    if missing:
        raise KeyError(f"stats lack {missing} (expected keys: {STATS_KEYS})")
    return sum(cfg.weights[w] * jnp.asarray(stats[s], jnp.float32) for s, w in EFFORT_WEIGHTS.items())


def length_penalty_batch(stats: Mapping[str, Array], cfg) -> Float[Array, " n"]:
    """Vectorised length penalty ``scale · f(x; k, q)`` (>= 0) over arrays of stats [n].

    ``cfg`` is the ``c.rl.length_penalty`` ConfigDict (k, q, scale, weights, enabled).
    """
    x = effort(stats, cfg)
    if not cfg.enabled:
        return jnp.zeros_like(x)
    return cfg.scale * penalty_curve(x, cfg.k, cfg.q)


def length_penalty(stats: Mapping[str, float], cfg) -> float:
    """Length penalty of one rollout (a non-negative float to subtract from the reward)."""
    return float(length_penalty_batch(stats, cfg))


# ----------------------------------------------------------------------------- behaviour hooks
def unfinished_todos_penalty(stats: Mapping[str, float]) -> float:
    """-(todos created but not completed): the report's product penalty (docs/SPEC.md §4)."""
    created, done = stats["todos_created"], stats["todos_completed"]
    if created < 0 or done < 0:
        raise ValueError(f"negative todo counts: created={created}, completed={done}")
    return -float(max(created - done, 0))


def malformed_calls_penalty(stats: Mapping[str, float]) -> float:
    """-(number of malformed tool calls): a penalty for bad tool calls (docs/SPEC.md §4)."""
    n = stats["malformed_calls"]
    if n < 0:
        raise ValueError(f"negative malformed_calls: {n}")
    return -float(n)


BEHAVIOUR_HOOKS: dict[str, Callable[[Mapping[str, float]], float]] = {
    "unfinished_todos": unfinished_todos_penalty,
    "malformed_calls": malformed_calls_penalty,
}


def register_behaviour_hook(name: str, fn: Callable[[Mapping[str, float]], float]) -> None:
    """Add a behaviour reward hook (weight it through ``c.rl.behaviour.<name>``)."""
    if name in BEHAVIOUR_HOOKS:
        raise ValueError(f"behaviour hook {name!r} already registered")
    BEHAVIOUR_HOOKS[name] = fn


def total_reward(task_reward: float, stats: Mapping[str, float], cfg) -> tuple[float, dict[str, float]]:
    """Task reward − length penalty + Σ weight·behaviour hooks (docs/SPEC.md §4).

    ``cfg`` is the ``c.rl`` ConfigDict (uses ``cfg.length_penalty`` and ``cfg.behaviour``).
    Returns ``(reward, breakdown)``; the breakdown has ``task``, ``length_penalty`` (>= 0,
    subtracted), ``effort`` (x), one ``behaviour/<name>`` entry per weighted hook (the
    weighted contribution) and ``total``.
    """
    unknown = [n for n in cfg.behaviour if n not in BEHAVIOUR_HOOKS]
    if unknown:
        raise ValueError(f"c.rl.behaviour names unknown hooks {unknown}; known: {sorted(BEHAVIOUR_HOOKS)}")
    lp = length_penalty(stats, cfg.length_penalty)
    breakdown = {"task": float(task_reward), "length_penalty": lp,
                 "effort": float(effort(stats, cfg.length_penalty))}
    total = float(task_reward) - lp
    for name, weight in cfg.behaviour.items():
        if weight == 0:
            continue
        contrib = float(weight) * float(BEHAVIOUR_HOOKS[name](stats))
        breakdown[f"behaviour/{name}"] = contrib
        total += contrib
    breakdown["total"] = total
    return total, breakdown
