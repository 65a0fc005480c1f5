"""Global sequence packing for RL steps: balance per-rank compute across DP ranks (docs/SPEC.md §2).

Cost model of one sequence of ``n`` tokens: ``c(n) = a*n + b*n^2`` (linear: MLP/projections/MoE per
token; quadratic: causal attention, whose work grows with the square of the segment length because
attention is segment-isolated). ``a``/``b`` come from the config or from `fit_cost_model`, a least
squares fit of measured step times against ``(sum n, sum n^2)`` per step (non-negative).

Partitioners (all return an `Assignment`):

* ``round_robin``: rollout i -> rank i mod R (the naive baseline, no cost model);
* ``lpt``: Longest Processing Time first — sort by cost, give each to the least-loaded rank
  (with ``equal_count`` only ranks with free slots; static shapes need the same number of rows per
  rank); then a local search moves/swaps items between the most and least loaded ranks while that
  lowers the maximum;
* ``kk``: Karmarkar–Karp largest differencing for R-way partitions (no count constraint), then the same
  local search.

``imbalance = max(rank load) / mean(rank load)`` (1 = perfect), reported by every method;
`rank_order` turns an assignment into the row order that a contiguous batch sharding over the DP axes
(`horizon.parallel.mesh.BATCH_AXES`) hands to each rank.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

import numpy as np

from horizon.model import params as model_params

METHODS = ("round_robin", "lpt", "kk")
ROW_ORDER_METHODS = ("none", "round_robin", "lpt")   # `balanced_row_order` (equal rows per rank)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """c(n) = a*n + b*n^2 (+ ``c0`` per step when fitted with an intercept; it does not affect balance)."""

    a: float = 1.0
    b: float = 0.0
    c0: float = 0.0

    def __call__(self, lengths) -> np.ndarray:
        n = np.asarray(lengths, np.float64)
        return self.a * n + self.b * n * n


def cost_model_from_config(pcfg) -> CostModel:
    """From ``cfg.packing`` fields ``cost_a`` / ``cost_b``."""
    a, b = float(pcfg.cost_a), float(pcfg.cost_b)
    if a < 0 or b < 0 or a + b <= 0:
        raise ValueError(f"cost model needs a, b >= 0 and not both 0, got a={a}, b={b}")
    return CostModel(a, b)


def fit_cost_model(step_lengths: Sequence[Sequence[int]], step_times: Sequence[float], *,
                   intercept: bool = True) -> CostModel:
    """Least-squares ``time ~ c0 + a*sum(n) + b*sum(n^2)`` over measured steps; a, b clipped >= 0
    (refitting the other when one clips)."""
    t = np.asarray(step_times, np.float64)
    if len(step_lengths) != len(t) or len(t) < 2 + int(intercept):
        raise ValueError("need one length list per step time and at least as many steps as coefficients")
    s1 = np.array([np.sum(np.asarray(ls, np.float64)) for ls in step_lengths])
    s2 = np.array([np.sum(np.asarray(ls, np.float64) ** 2) for ls in step_lengths])
    cols = [s1, s2] + ([np.ones_like(s1)] if intercept else [])

    def solve(use):
        X = np.stack([cols[i] for i in use], axis=1)
        coef, *_ = np.linalg.lstsq(X, t, rcond=None)
        full = np.zeros(len(cols))
        full[list(use)] = coef
        return full

    use = list(range(len(cols)))
    coef = solve(use)
    for i in (0, 1):
        if coef[i] < 0:
            use.remove(i)
            coef = solve(use)
    a, b = max(coef[0], 0.0), max(coef[1], 0.0)
    return CostModel(a, b, float(coef[2]) if intercept else 0.0)


@dataclasses.dataclass
class Assignment:
    ranks: list[list[int]]      # rollout indices per rank
    loads: np.ndarray           # cost per rank
    method: str

    @property
    def imbalance(self) -> float:
        mean = float(np.mean(self.loads))
        return float(np.max(self.loads) / mean) if mean > 0 else 1.0

    def summary(self) -> str:
        counts = [len(r) for r in self.ranks]
        return (f"{self.method:<12} max/mean={self.imbalance:.4f}  max={self.loads.max():.4g} "
                f"mean={self.loads.mean():.4g}  rows/rank={min(counts)}..{max(counts)}")


def _loads(ranks, cost) -> np.ndarray:
    return np.array([cost[r].sum() if r else 0.0 for r in ranks])


def round_robin(cost: np.ndarray, n_ranks: int) -> list[list[int]]:
    return [list(range(i, len(cost), n_ranks)) for i in range(n_ranks)]


def _lpt(cost: np.ndarray, n_ranks: int, cap: int | None) -> list[list[int]]:
    ranks: list[list[int]] = [[] for _ in range(n_ranks)]
    heap = [(0.0, r) for r in range(n_ranks)]
    for i in np.argsort(-cost, kind="stable"):
        full = []
        load, r = heapq.heappop(heap)
        while cap is not None and len(ranks[r]) >= cap:
            full.append((load, r))
            load, r = heapq.heappop(heap)
        ranks[r].append(int(i))
        heapq.heappush(heap, (load + float(cost[i]), r))
        for f in full:
            heapq.heappush(heap, f)
    return ranks


def _kk(cost: np.ndarray, n_ranks: int) -> list[list[int]]:
    """Karmarkar–Karp differencing: merge the two partial partitions with the largest spread,
    pairing the heaviest subset of one with the lightest of the other."""
    heap = []
    for i in range(len(cost)):
        sets = [[int(i)]] + [[] for _ in range(n_ranks - 1)]
        sums = [float(cost[i])] + [0.0] * (n_ranks - 1)
        heapq.heappush(heap, (-(sums[0]), i, sums, sets))
    tie = len(cost)
    while len(heap) > 1:
        _, _, s1, p1 = heapq.heappop(heap)
        _, _, s2, p2 = heapq.heappop(heap)
        o1 = np.argsort(s1)[::-1]          # heaviest first
        o2 = np.argsort(s2)                # lightest first
        sums = [s1[a] + s2[b] for a, b in zip(o1, o2)]
        sets = [p1[a] + p2[b] for a, b in zip(o1, o2)]
        tie += 1
        heapq.heappush(heap, (-(max(sums) - min(sums)), tie, sums, sets))
    return heap[0][3]


def _local_search(ranks: list[list[int]], cost: np.ndarray, keep_counts: bool, max_iter: int = 10_000):
    """Move (if counts may change) or swap items between the max- and min-loaded ranks while the pair's
    max load decreases."""
    loads = _loads(ranks, cost)
    for _ in range(max_iter):
        hi, lo = int(np.argmax(loads)), int(np.argmin(loads))
        gap = loads[hi] - loads[lo]
        if gap <= 0:
            break
        best, best_delta = None, 0.0
        ch, cl = cost[ranks[hi]], cost[ranks[lo]]
        if not keep_counts:  # move item x from hi to lo: new pair max = max(hi - x, lo + x)
            for ai, x in enumerate(ch):
                delta = loads[hi] - max(loads[hi] - x, loads[lo] + x)
                if delta > best_delta + 1e-12:
                    best, best_delta = ("move", ai, None), delta
        # swap x (hi) with y (lo), x > y: transfer t = x - y in (0, gap)
        if len(ch) and len(cl):
            t = ch[:, None] - cl[None, :]
            new_max = np.maximum(loads[hi] - t, loads[lo] + t)
            delta = loads[hi] - new_max
            ai, bi = np.unravel_index(np.argmax(delta), delta.shape)
            if delta[ai, bi] > best_delta + 1e-12:
                best, best_delta = ("swap", int(ai), int(bi)), float(delta[ai, bi])
        if best is None:
            break
        kind, ai, bi = best
        x = ranks[hi].pop(ai)
        if kind == "swap":
            y = ranks[lo].pop(bi)
            ranks[hi].append(y)
        ranks[lo].append(x)
        loads = _loads(ranks, cost)
    return ranks


def balance(lengths: Sequence[int], n_ranks: int, cost_model: CostModel = CostModel(), *,
            method: str = "lpt", equal_count: bool = False, refine: bool = True) -> Assignment:
    """Assign rollouts (by token length) to `n_ranks` DP ranks minimising the max per-rank cost.

    `equal_count` forces ``len(lengths) / n_ranks`` rollouts per rank (must divide), as needed when
    each rollout is one row of a statically shaped, evenly sharded batch."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}; expected one of {METHODS}")
    if n_ranks < 1:
        raise ValueError("n_ranks must be >= 1")
    cost = cost_model(np.asarray(lengths))
    cap = None
    if equal_count:
        if len(cost) % n_ranks:
            raise ValueError(f"equal_count needs len(lengths)={len(cost)} divisible by n_ranks={n_ranks}")
        cap = len(cost) // n_ranks
    if method == "round_robin":
        ranks = round_robin(cost, n_ranks)
        refine = False
    elif method == "lpt":
        ranks = _lpt(cost, n_ranks, cap)
    else:
        if equal_count:
            raise ValueError("kk does not support equal_count; use lpt")
        ranks = _kk(cost, n_ranks)
    if refine:
        ranks = _local_search(ranks, cost, keep_counts=equal_count)
    return Assignment([sorted(r) for r in ranks], _loads(ranks, cost), method)


def rank_order(assignment: Assignment) -> np.ndarray:
    """Row permutation: rows of rank 0, then rank 1, ... (equal counts needed for an even split)."""
    counts = {len(r) for r in assignment.ranks}
    if len(counts) != 1:
        raise ValueError(f"ranks hold different row counts {sorted(counts)}: use equal_count=True")
    return np.concatenate([np.asarray(r, np.int64) for r in assignment.ranks])


def model_cost_model(model_cfg) -> CostModel:
    """The analytic, attention-aware cost of one row of ``n`` tokens for `model_cfg` (forward FLOPs;
    the backward's 2x scales both terms alike, so the balance is the same):
    ``a = 2 * (active params - embedding table)`` per token (every matmul), and
    ``b = layers * heads * (qk_head_dim + v_head_dim)`` per token pair (QK^T and PV over the
    ``n^2 / 2`` causal pairs, 2 FLOPs each)."""
    m = model_cfg
    active = model_params.count_params(m)["active"] - int(m.vocab_size) * int(m.d_model)
    qk = int(m.qk_nope_head_dim) + int(m.qk_rope_head_dim)
    return CostModel(a=2.0 * active, b=float(int(m.num_layers) * int(m.num_heads) * (qk + int(m.v_head_dim))))


def balanced_row_order(lengths: np.ndarray, n_ranks: int, cost_model: CostModel, *, method: str = "lpt"
                       ) -> tuple[np.ndarray, dict]:
    """Row order for a statically shaped batch sharded contiguously over `n_ranks` data-parallel
    ranks: `lengths` is ``[R]`` (one step) or ``[M, r]`` (micro-batches, each balanced on its own).
    ``method`` (`ROW_ORDER_METHODS`) "none" keeps the order. Returns (order shaped like `lengths`, stats): the estimated
    step cost's imbalance ``sum_m max_rank / sum_m mean_rank`` for the new order (``imbalance``) and
    for the given one (``imbalance_naive``)."""
    lens = np.asarray(lengths)
    blocks = lens.reshape(-1, lens.shape[-1])
    if blocks.shape[1] % n_ranks:
        raise ValueError(f"{blocks.shape[1]} rows do not split over {n_ranks} ranks")
    orders, new_max, old_max, mean = [], 0.0, 0.0, 0.0
    for row_lens in blocks:
        cost = cost_model(row_lens)
        if method == "none" or n_ranks == 1:
            order = np.arange(len(row_lens))
        else:
            order = rank_order(balance(row_lens, n_ranks, cost_model, method=method, equal_count=True))
        orders.append(order)
        new_loads = cost[order].reshape(n_ranks, -1).sum(axis=1)     # contiguous blocks = ranks
        new_max += new_loads.max()
        mean += new_loads.mean()                                      # the same in either order
        old_max += cost.reshape(n_ranks, -1).sum(axis=1).max()
    stats = dict(imbalance=new_max / mean if mean > 0 else 1.0, imbalance_naive=old_max / mean if mean > 0 else 1.0,
                 ranks=n_ranks)
    return np.stack(orders).reshape(lens.shape), stats
