"""Synchronous RL on a procedural task family in sandboxes (docs/SPEC.md §4, §6, §7).

The shared core of experiments/rl.py (config-edit family, `make run`), experiments/selfsum.py
(key-recall family, three context strategies) and experiments/rl_async.py's sync baseline;
episodes, sandboxes and rewards come from the environment layer (`horizon.env.rollouts`):

- `evaluate`: `passes` sampled passes over held-out tasks through the eval harness in the
  env's sandbox pool; the std over passes is the eval noise, best-of-K = tasks solved by any
  pass; efficiency stats per episode;
- `run_rl`: the synchronous loop — `horizon.rl.runtime.core`'s prompt schedule, group rollouts and
  train step (the async runtime's pieces, at staleness 0), periodic eval (`heldout_evaluator`),
  checkpoints (RLState + prompt schedule; a rerun resumes).

The SFT warm start before it is `horizon.rl.runtime.warmstart`.

Everything reads the experiment config `c` (configs/rl_tiny.py's `exp` block): no
hyperparameter lives here.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.families import family_from_config
from horizon.env.rollouts import SANDBOX_USE_KEYS
from horizon.eval import harness
from horizon.inference import policy as engine_policy
from horizon.inference import sampler
from horizon.rl.algo import batch as rlbatch
from horizon.rl.runtime import core as runtime
from horizon.rl.runtime import steptime, warmup
from horizon.utils import compiles
from horizon.utils.config import dump_config
from horizon.utils.progress import progress, say
from horizon.utils.seeds import run_keys
from horizon.utils.tracking import MetricsWriter

# A run's record log: a `MetricsWriter` (JSONL, TensorBoard, W&B; it also takes the RL step's
# histograms and transcripts) or any callable taking one record (tests pass `list.append`).
Log = Callable[[dict], None]


def start_run(c: ml_collections.ConfigDict):
    """The common start of a driver, after `horizon.utils.cli.load` has parsed and validated `c`:
    the run dir `exp.out_dir` with config.json, the XLA compilation cache, tokenizer, metrics log
    (`MetricsWriter`: metrics.jsonl, TensorBoard, W&B), task family. Returns (out_dir, tok, log, family)."""
    out_dir = pathlib.Path(c.exp.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_config(c, out_dir / "config.json")
    compiles.use_persistent_cache(str(c.exp.get("compilation_cache_dir", "") or ""))
    return out_dir, tokenizer_from_config(c), MetricsWriter(out_dir, c), family_from_config(c.exp)


def evaluate(env, params, tasks, c, tok, key, version: int, push=None) -> dict:
    """`c.exp.eval.passes` sampled passes over `tasks` through the eval harness in `env`'s pooled
    sandboxes (`harness.pooled_setup`, `harness.run_eval`): `harness.pass_summary`'s mean,
    std over passes (the eval noise), best-of-passes, per-pass means and efficiency, and the episode
    ``records`` (kept in the run's result for a study ledger, `horizon.studies.arms`; not logged)."""
    ev = c.exp.eval
    policy = engine_policy.rollout_policy(sampler.ParamsHolder(params, version=version), c, key,
                                          temperature=float(ev.temperature), push=push)
    records = harness.run_eval(policy, tasks, harness.pooled_setup(env, tok, int(ev.passes)), policy_name=f"v{version}")
    return dict(harness.pass_summary(records), records=records)


def heldout_evaluator(env, tasks, c, tok, push=None) -> Callable[[Any, int], dict]:
    """`run_rl`'s eval hook: `evaluate` on `tasks` in `env`, sampling key
    ``fold_in(run_keys(seed)["eval"], step)`` (`push`: the remote backend's, `remote.push_for`)."""
    key = run_keys(c.seed)["eval"]
    return lambda params, step: evaluate(env, params, tasks, c, tok, jax.random.fold_in(key, step), step, push)


# ----------------------------------------------------------------------------- RL
def run_rl(params, env, c, tok, out: pathlib.Path, log: Log, *, evaluate: Callable[[Any, int], dict] | None = None,
           store=None, tag: str = "", push=None) -> dict:
    """The synchronous RL loop (docs/SPEC.md §4) from `params` on `env` (`.rollouts(requests, policy, tok)`,
    e.g. `horizon.env.rollouts.ExperimentEnv` or `workers.ToyEnv`), `c.exp.steps` steps: step t's
    prompts (`runtime.PromptSchedule`), its generation batches rolled out with version t
    (`runtime.rollout_groups`), one `runtime.train_groups` — the same pieces the async runtime's
    workers and trainer run, at staleness 0. Checkpoints (RLState + schedule) every
    `rl.checkpoint_every` steps and at the end in out/ckpt; a rerun resumes. `evaluate(params,
    step) -> dict`, if given, runs at step 0, every `exp.eval.every` steps and at the end; each
    step's groups also go to `store` (a `storage.GroupStore`, the async runtime's layout), if given.
    `push`: the remote backend's weight push (`remote.push_for`; None = the in-process engine).
    Returns {"evals": {step: eval}, "state": RLState}."""
    steps = int(c.exp.steps)
    sched = runtime.PromptSchedule(c, steps, lag=0)
    state, ck, meta = runtime.resume_rl_state(params, c, out / "ckpt")
    start = 0
    if meta is not None:
        start = int(meta["step"])
        sched.load_state_dict(meta["schedule"])
        print(f"{tag}RL: resumed at step {start}", flush=True)
    run = {"run": tag.strip(": ")} if tag else {}
    evals = {}

    def do_eval(step):
        if evaluate is not None:
            evals[step] = _eval_and_log(evaluate, state.params, step, log, run, tag)

    if bool(c.exp.get("warmup", False)):
        log(dict(warmup.warm_up(state, c, tag=tag), phase="warmup", step=start, **run))
    if start == 0:
        do_eval(0)
    t_start = time.time()
    bar = progress(total=steps, initial=start, desc=f"{tag}RL", unit="step")
    for step in range(start, steps):
        t0 = time.time()
        if sched.assign(step) is None:
            print(f"{tag}prompt set exhausted (single epoch): stopping", flush=True)
            break
        c0 = compiles.meter().snapshot()
        groups, usage = _roll_out_step(env, sched, step, state.params, c, tok, store, push)
        t_roll, c1 = time.time() - t0, compiles.meter().snapshot()
        t1 = time.time()
        state, rec, b = runtime.train_groups(state, groups, c)
        t_train, c2 = time.time() - t1, compiles.meter().snapshot()
        rec.update(_step_metrics(c, step, groups, b, run, rollout_s=t_roll, gen_s=usage["gen_s"],
                                 train_s=t_train, step_s=time.time() - t0))
        rec.update(steptime.split(rollout_s=t_roll, train_s=t_train, usage=usage, rollout_c=c1.minus(c0),
                                  train_c=c2.minus(c1), train_host_s=rec["time/train_host_s"]))
        compiled = c2.minus(c0)
        log(rec)
        if isinstance(log, MetricsWriter):
            _log_step_extras(log, groups, step, tok, run.get("run"))
        say(_step_line(rec, c, tag, step, steps, elapsed_s=time.time() - t_start))
        say(f"{tag}  {steptime.line(rec)}" + (f"; compiled {compiled.top()}" if compiled.compiles else ""))
        bar.set_postfix(reward=rec["reward_mean"])
        bar.update(1)
        ck.save(step + 1, state, {"step": step + 1, "schedule": sched.state_dict()}, force=step + 1 == steps)
        every = int(c.exp.eval.every) if "eval" in c.exp else 0
        if step + 1 < steps and every > 0 and (step + 1) % every == 0:
            do_eval(step + 1)
    bar.close()
    final = int(jax.device_get(state.step))
    if final not in evals:
        do_eval(final)
    ck.close()
    return {"evals": evals, "state": state}


def _eval_and_log(evaluate, params, step: int, log: Log, run: dict, tag: str) -> dict:
    """`run_rl`'s eval at `step`: `evaluate(params, step)`, timed, logged and printed."""
    t0, c0 = time.time(), compiles.meter().snapshot()
    e = dict(evaluate(params, step), phase="eval", step=step, eval_s=time.time() - t0, **run)
    compiled = compiles.meter().snapshot().minus(c0)
    e.update(compiled.record("time/compile_"))
    log({k: v for k, v in e.items() if k != "records"})
    if isinstance(log, MetricsWriter) and e.get("heldout_passes"):
        log.table("eval/passes", [dict(step=step, pass_index=i, success=x) for i, x in enumerate(e["heldout_passes"])],
                  step, run=run.get("run"))
    say(f"{tag}eval @ {step}: held-out {e['heldout_mean']:.3f} ± {e['heldout_std']:.3f} "
          f"(passes {[f'{x:.3f}' for x in e['heldout_passes']]}), best-of-{len(e['heldout_passes'])} "
          f"{e['heldout_best_of_k']:.3f} ({e['eval_s']:.0f}s, compile {e['time/compile_s']:.0f}s"
          + (f": {compiled.top()})" if compiled.compiles else ")"))
    return e


def _roll_out_step(env, sched, step: int, params, c, tok, store, push=None) -> tuple[list, dict]:
    """Step `step`'s generation batches rolled out with `params` as version `step`; the schedule is
    fed the step's groups, which also go to `store` if given. Returns (groups, the batches' engine
    usage summed: `steptime.USAGE_KEYS`)."""
    groups, usage = [], {}
    for reqs in sched.batches(step):
        recs, info = runtime.rollout_groups(env, reqs, lambda p=params, v=step: (p, v), c, tok, push=push)
        groups += recs
        usage = steptime.add_usage(usage, info)
    sched.feed(step, groups)
    for g in groups if store is not None else ():
        store.put(g)
    return groups, usage


def _step_metrics(c, step: int, groups, b, run: dict, *, rollout_s: float, gen_s: float, train_s: float,
                  step_s: float) -> dict:
    """What `run_rl` adds to the train step's metrics for its record of `step` (groups `groups`,
    batch `b`): sizes, timings, generated tokens, episode outcomes, batch stats."""
    infos = [i for g in groups for i in g.infos]
    gen = sum(g.generated_tokens for g in groups)
    return dict(phase="rl", step=step + 1, group_size=int(c.rl.group_size), groups=len(groups), rollout_s=rollout_s,
                gen_s=gen_s, gen_tokens=gen, train_s=train_s, step_s=step_s,
                gen_tokens_per_s=gen / max(rollout_s, 1e-9),
                success=float(np.mean([i.get("verifier", i.get("reward", 0.0)) for i in infos])),
                malformed=float(np.mean([i.get("malformed_calls", 0) > 0 for i in infos])),
                summaries=float(np.mean([i.get("summaries", 0) for i in infos])), **sandbox_use(infos), **run,
                **{f"batch/{k}": v for k, v in rlbatch.batch_stats(b).items()})


def sandbox_use(infos) -> dict:
    """A step's sandbox time summed over its episodes (`sandbox_s`, split by phase as
    `sandbox/<phase>_s`) and its sandbox actions (`horizon.env.rollouts.SANDBOX_USE_KEYS`): the sync
    loop's step records and the async trainer's (`processes.trainer_main`)."""
    tot = {k: float(sum(i.get(f"sandbox_{k}", 0) for i in infos)) for k in SANDBOX_USE_KEYS}
    return {"sandbox_s": sum(v for k, v in tot.items() if k.endswith("_s")), "sandbox/actions": int(tot["actions"]),
            **{f"sandbox/{k}": v for k, v in tot.items() if k.endswith("_s")}}


def _step_line(rec: dict, c, tag: str, step: int, steps: int, *, elapsed_s: float) -> str:
    """`run_rl`'s printed line for the record `rec` of `step` (`elapsed_s`: since the loop began)."""
    return (f"{tag}step {step + 1}/{steps}: reward {rec['reward_mean']:.3f} best-of-{c.rl.group_size} "
            f"{rec['best_of_k']:.3f} success {rec['success']:.3f} malformed {rec['malformed']:.2f} "
            f"kl {rec.get('kl_k1', 0.0):.2e} gen {rec['gen_s']:.1f}s ({rec['gen_tokens_per_s']:.0f} tok/s of rollout) "
            f"rollout {rec['rollout_s']:.1f}s (sandbox {rec['sandbox_s']:.1f}s over {rec['sandbox/actions']} actions) "
            + (f"pack {rec['pack/imbalance']:.3f} (naive {rec['pack/imbalance_naive']:.3f}) "
               if rec["pack/ranks"] > 1 else "")
            + (f"infra: {rec['infra/infra_episodes']:.0f} failed episodes, {rec['infra/group_retries']:.0f} "
               f"retries, {rec['infra/replaced_groups']:.0f} replaced groups, "
               f"{rec['infra/sandboxes_replaced']:.0f} new sandboxes "
               if any(rec[f"infra/{k}"] for k in runtime.INFRA_KEYS) else "") +
            f"train {rec['train_s']:.1f}s ({elapsed_s:.0f}s)")


def gain_summary(evals: dict, records: list[dict]) -> dict:
    """The must-show numbers of a run: held-out gain vs 3 x eval noise, best-of-K start/end."""
    first, last = evals[min(evals)], evals[max(evals)]
    noise = max(first["heldout_std"], last["heldout_std"])
    rl_recs = [r for r in records if r.get("phase") == "rl"]
    return dict(heldout_start=first["heldout_mean"], heldout_end=last["heldout_mean"],
                heldout_gain=last["heldout_mean"] - first["heldout_mean"], eval_noise_std=noise,
                gain_over_3std=bool(last["heldout_mean"] - first["heldout_mean"] > 3 * noise),
                heldout_best_of_k_start=first["heldout_best_of_k"], heldout_best_of_k_end=last["heldout_best_of_k"],
                train_best_of_k_first=rl_recs[0]["best_of_k"] if rl_recs else None,
                train_best_of_k_last=rl_recs[-1]["best_of_k"] if rl_recs else None, steps=max(evals))


def _log_step_extras(log: MetricsWriter, groups, step: int, tok, run: str | None) -> None:
    """RL step `step`'s histograms (rewards, advantages, token staleness) and, every
    ``exp.text_every`` steps, one rollout transcript (`runtime.transcript`)."""
    log.histograms(step + 1, runtime.step_histograms(groups, step), run=run)
    if log.wants_text(step + 1) and groups:
        log.text("rl/transcript", runtime.transcript(groups[0], tok), step + 1, run=run)
