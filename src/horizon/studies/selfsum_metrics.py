"""The self-summarization study's metrics (docs/SPEC.md §6, §7): pure functions of per-episode
records, so every number in `selfsum.md` can be checked by hand on a synthetic trajectory.

An episode record (`episode_record`, one per held-out episode of the final eval) is a dict with
`strategy`, `seed`, `task_id`, `pass_index`, `solved`, `generated_tokens` (tokens the policy
decoded, each once), `summaries`, `summary_tokens`, `rewrites` (context rewrites: segments - 1),
`prefill_tokens` (`prefill_tokens`), `compaction_error` (`compaction_error`), and what the summaries
carried (`memory_carry`: `needed_seen`, `needed_kept`, `distractors_seen`, `distractors_kept`).

- success: mean over seeds x tasks x passes with a 95% bootstrap CI (`bootstrap_ci`: tasks
  resampled within each seed, each with all its passes — passes of one task are not independent);
- the paired difference to self-summary per seed (`paired_differences`: same tasks, same passes);
- compaction-caused errors: failed episodes whose memory after the last compaction no longer
  holds a needed fact that the context held before it (`compaction_error`; the blog's count,
  checked on the summary text for the summarizing strategies);
- tokens per summary, generated tokens per solved task, prefill tokens per episode, summaries
  per episode and per solved episode (`strategy_row`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jaxtyping import Int

from horizon.inference.slots import common_prefix  # the engine's own LCP, which its reuse counts use


def compaction_error(solved: bool, seen_before: Sequence[str], memory: str) -> bool:
    """A failed episode whose `memory` (the last summary's text; for strategies without one, what
    the final context kept) lacks a needed fact that the context held before the last compaction
    (`seen_before`). Succeeded episodes and episodes that never compacted are never counted."""
    return (not solved) and any(f not in memory for f in seen_before)


def memory_carry(summaries: Sequence[tuple[str, str]], needed: Sequence[str], distractors: Sequence[str]) -> dict:
    """What an episode's memory carried to its end: over its (context before the summary, summary
    text) pairs, the needed facts any summarized context held (`needed_seen`) and how many of them
    the last summary still writes (`needed_kept`), and the same for the distractors. A fact read
    before a summary survives only through every summary after it, so this is the end-to-end carry
    the final answer depends on (docs/RESULTS.md); 0 / 0 for an episode that never summarized."""
    out = dict(needed_seen=0, needed_kept=0, distractors_seen=0, distractors_kept=0)
    if not summaries:
        return out
    before = "\n".join(b for b, _ in summaries)
    last = summaries[-1][1]
    for kind, facts in (("needed", needed), ("distractors", distractors)):
        seen = [f for f in facts if f in before]
        out[f"{kind}_seen"], out[f"{kind}_kept"] = len(seen), sum(f in last for f in seen)
    return out


def prefill_tokens(segments: Sequence[Int[np.ndarray, " n"]], generated: int) -> int:
    """Tokens an engine with one KV cache per episode prefills (computes without decoding them):
    every position of every segment except its longest common prefix with the previous segment
    (the cache survives a rewrite up to the first changed token; `horizon.inference.engine`'s
    LCP reuse), minus the `generated` tokens the policy decoded (those are computed by decoding).
    A self-summary restart keeps [system, task]; masking keeps everything up to the first newly
    masked output."""
    total, prev = 0, None
    for s in segments:
        total += len(s) - (0 if prev is None else common_prefix(s, prev))
        prev = s
    return int(total - generated)


def bootstrap_ci(solved_by_seed: dict, *, samples: int, level: float, seed: int) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean success. `solved_by_seed`: {seed: {task_id: [0/1 per
    pass]}}; each replicate resamples, within every seed, its tasks with replacement (all passes of
    a drawn task come along) and takes the mean over all drawn episodes."""
    rng = np.random.default_rng(seed)
    per_seed = [[np.asarray(v, np.float64) for v in tasks.values()] for tasks in solved_by_seed.values()]
    sums = [np.asarray([v.sum() for v in t]) for t in per_seed]
    counts = [np.asarray([len(v) for v in t]) for t in per_seed]
    reps = np.empty(samples)
    for i in range(samples):
        s = n = 0.0
        for su, co in zip(sums, counts):
            idx = rng.integers(0, len(su), len(su))
            s, n = s + su[idx].sum(), n + co[idx].sum()
        reps[i] = s / n
    a = (1.0 - level) / 2
    return float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))


def _by_seed_task(records: Sequence[dict]) -> dict:
    out: dict = {}
    for r in records:
        out.setdefault(r["seed"], {}).setdefault(r["task_id"], []).append(float(bool(r["solved"])))
    return out


def paired_differences(records: Sequence[dict], baseline: Sequence[dict]) -> dict:
    """{seed: success(records) - success(baseline)} for the seeds both have (same held-out tasks and
    passes per seed: the difference is paired)."""
    a, b = _by_seed_task(records), _by_seed_task(baseline)
    mean = lambda d: float(np.mean([x for v in d.values() for x in v]))  # noqa: E731
    return {s: mean(a[s]) - mean(b[s]) for s in sorted(set(a) & set(b))}


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den else None


def strategy_row(records: Sequence[dict], *, baseline: Sequence[dict] | None, samples: int, level: float,
                 seed: int) -> dict:
    """One strategy's numbers over its episode records (all seeds): success mean and CI, paired
    differences to `baseline` (self-summary's records; None for self-summary itself), compaction-
    caused errors (count and share of episodes), tokens per summary, generated tokens per solved
    task, prefill tokens / summaries / context rewrites per episode, and summaries per solved
    episode (key_relay: a solved chain must carry keys through >= 2 summaries)."""
    n = len(records)
    solved = sum(bool(r["solved"]) for r in records)
    summaries = sum(r["summaries"] for r in records)
    lo, hi = bootstrap_ci(_by_seed_task(records), samples=samples, level=level, seed=seed)
    return dict(episodes=n, seeds=len({r["seed"] for r in records}), success=solved / n, ci_lo=lo, ci_hi=hi,
                paired_diff=None if baseline is None else paired_differences(records, baseline),
                compaction_errors=sum(bool(r["compaction_error"]) for r in records),
                compaction_error_rate=sum(bool(r["compaction_error"]) for r in records) / n,
                tokens_per_summary=_ratio(sum(r["summary_tokens"] for r in records), summaries),
                gen_tokens_per_solved=_ratio(sum(r["generated_tokens"] for r in records), solved),
                prefill_per_episode=sum(r["prefill_tokens"] for r in records) / n,
                summaries_per_episode=summaries / n,
                summaries_per_solved=_ratio(sum(r["summaries"] for r in records if r["solved"]), solved),
                rewrites_per_episode=sum(r["rewrites"] for r in records) / n)
