"""Synchronous RL on a procedural task family in sandboxes (docs/SPEC.md §4, §6, §7).

The shared core of experiments/rl.py (config-edit family, `make run`), experiments/selfsum.py
(key-recall family, three context strategies) and experiments/rl_async.py's sync baseline;
episodes, sandboxes and rewards come from the environment layer (`horizon.env.rollouts`):

- `evaluate`: `passes` sampled passes over held-out tasks through the eval harness in the
  env's sandbox pool; the std over passes is the eval noise, best-of-K = tasks solved by any
  pass; efficiency stats per episode;
- `run_sft`: next-token CE on demonstration rows (assistant tokens only), rows packed
  with segment ids (`horizon.data.packing`), orbax checkpoint + resume;
- `run_rl`: the synchronous loop — `horizon.rl.runtime.core`'s prompt schedule, group rollouts and
  train step (the async runtime's pieces, at staleness 0), periodic eval (`heldout_evaluator`),
  checkpoints (RLState + prompt schedule; a rerun resumes).

Everything reads the experiment config `c` (configs/rl_tiny.py's `exp` block): no
hyperparameter lives here.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from horizon.data.packing import pack_sequences
from horizon.data.tokenizer import tokenizer_from_config
from horizon.env import swe_demos
from horizon.env.demos import config_edit_demos
from horizon.env.families import Family, family_from_config
from horizon.env.rollouts import SANDBOX_USE_KEYS, SandboxPool
from horizon.eval import harness
from horizon.inference import policy as engine_policy
from horizon.inference import sampler
from horizon.model import hf, transformer
from horizon.parallel import mesh as pmesh
from horizon.rl.algo import batch as rlbatch
from horizon.rl.runtime import core as runtime
from horizon.rl.runtime import steptime, warmup
from horizon.train import lm
from horizon.train.checkpoint import Checkpointer, restore_params
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
    std over passes (the eval noise), best-of-passes, per-pass means and efficiency."""
    ev = c.exp.eval
    policy = engine_policy.rollout_policy(sampler.ParamsHolder(params, version=version), c, key,
                                          temperature=float(ev.temperature), push=push)
    records = harness.run_eval(policy, tasks, harness.pooled_setup(env, tok, int(ev.passes)), policy_name=f"v{version}")
    return harness.pass_summary(records)


def heldout_evaluator(env, tasks, c, tok, push=None) -> Callable[[Any, int], dict]:
    """`run_rl`'s eval hook: `evaluate` on `tasks` in `env`, sampling key
    ``fold_in(run_keys(seed)["eval"], step)`` (`push`: the remote backend's, `remote.push_for`)."""
    key = run_keys(c.seed)["eval"]
    return lambda params, step: evaluate(env, params, tasks, c, tok, jax.random.fold_in(key, step), step, push)


# ----------------------------------------------------------------------------- SFT
@dataclasses.dataclass(frozen=True)
class SFTStage:
    """One `run_sft` stage: its name (checkpoint out/<name>, log phase), its overrides of
    `c.exp.sft` (`steps`, `seq_len`, `batch_size`, and `lr`: the peak of `c.exp.sft.optim`; None =
    the config's) and how often the probe runs (every `probe_every` steps; 0 = never)."""

    name: str = "sft"
    steps: int | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    probe_every: int = 0

    @classmethod
    def from_config(cls, c, name: str, *, clean: bool = False) -> SFTStage:
        """`two_stage_sft`'s stage `name`: stage 2 (`exp.sft` as it is) or, with `clean`, stage 1
        (`exp.sft.clean_steps`, `clean_seq_len`, `clean_batch_size`, `clean_lr`); both probe every
        `exp.sft.probe_every` steps (0 or absent: never)."""
        s = c.exp.sft
        every = int(s.get("probe_every", 0) or 0)
        if not clean:
            return cls(name=name, probe_every=every)
        return cls(name=name, steps=int(s.clean_steps), seq_len=s.get("clean_seq_len"),
                   batch_size=s.get("clean_batch_size"), lr=s.get("clean_lr"), probe_every=every)

    def config(self, c):
        """`c` with this stage's overrides in `exp.sft` (a copy; `c` itself if there are none)."""
        over = {k: int(v) for k, v in dict(steps=self.steps, seq_len=self.seq_len, batch_size=self.batch_size).items()
                if v is not None}
        if not over and self.lr is None:
            return c
        c = ml_collections.ConfigDict(c.to_dict())
        c.exp.sft.update(over)
        if self.lr is not None:
            c.exp.sft.optim.lr = float(self.lr)
        return c


def run_sft(params, rows, c, out: pathlib.Path, log: Log, *, stage: SFTStage = SFTStage(),
            probe: Callable[[Any], dict] | None = None):
    """Train `params` for `stage.steps` (default `c.exp.sft.steps`) on demonstration `rows`
    [(tokens, loss_mask)] packed into rows of `c.exp.sft.seq_len` (optimizer `c.exp.sft.optim`,
    schedule sized to the steps); resumes from out/<stage.name> if a finished checkpoint is there.
    `rows` may be a zero-argument callable, called only when there is no checkpoint. `stage`'s
    overrides of `c.exp.sft` hold for this call only; `exp.sft.remat`, if set, replaces
    `model.remat` for SFT (whose rows may fit without the RL trainer's recompute).
    `probe(params) -> {name: float}`, if given, runs every `stage.probe_every` steps and at the
    end, and its numbers join the log record (e.g. selfsum's key-copy accuracy, to see when a copy
    forms); it reads the params only."""
    c = stage.config(c)
    s, name = c.exp.sft, stage.name
    sc, state = _sft_state(params, c)
    # the same partitioned LM step as experiments/pretrain.py, on the run's mesh (c.mesh)
    step_fn, st_sh, _ = lm.make_train_step(sc, pmesh.mesh_from_config(c), jax.eval_shape(lambda: state))
    state = jax.device_put(state, st_sh)
    ck = Checkpointer(out / name, every=max(1, int(s.steps)), keep=1)
    got = ck.restore_latest(state)
    if got is not None:
        ck.close()
        if int(got[1]["step"]) != int(s.steps):     # checkpoints are written at the end only: a finished run
            raise ValueError(f"{out / name} holds a finished {got[1]['step']}-step SFT but this config asks for "
                             f"{s.steps} steps: remove that directory or pick another --config.exp.out_dir")
        print(f"{name}: restored step {got[1]['step']} from {out / name}", flush=True)
        return got[0].params
    if callable(rows):
        rows = rows()
    packed = pack_sequences([r[0] for r in rows], int(s.seq_len), pad_id=tok_pad(c),
                            extras={"mask": [np.asarray(r[1], np.float32) for r in rows]})
    B = int(s.batch_size)
    if packed.num_rows < B:
        raise ValueError(f"{len(rows)} demo rows pack into {packed.num_rows} rows < exp.sft.batch_size={B}")
    rng = np.random.default_rng(int(c.seed))
    print(f"{name}: {len(rows)} demo rows packed into {packed.num_rows} rows of {s.seq_len} tokens "
          f"({packed.lengths.sum() / packed.tokens.size:.0%} full)", flush=True)
    t0, c0 = time.time(), compiles.meter().snapshot()
    bar = progress(total=int(s.steps), desc=name, unit="step")
    for i in range(int(s.steps)):
        idx = rng.choice(packed.num_rows, B, replace=False)
        b = dict(tokens=packed.tokens[idx], segment_ids=packed.segment_ids[idx], positions=packed.positions[idx],
                 mask=packed.extras["mask"][idx])
        state, m = step_fn(state, b)
        last = i + 1 == int(s.steps)
        probed = probe is not None and stage.probe_every > 0 and ((i + 1) % stage.probe_every == 0 or last)
        if (i + 1) % int(s.log_every) == 0 or last or probed:
            rec = dict(phase=name, step=i + 1, loss=float(m["loss"]), wall_s=time.time() - t0,
                       **compiles.meter().snapshot().minus(c0).record("time/compile_"))
            extra = probe(state.params) if probed else {}
            log(dict(rec, **extra))
            say(f"{name} {i + 1}/{s.steps}: loss {rec['loss']:.4f} ({rec['wall_s']:.0f}s)"
                + "".join(f", {k} {v:.3f}" for k, v in extra.items()))
            bar.set_postfix(loss=rec["loss"])
        bar.update(1)
    bar.close()
    ck.save(int(s.steps), state, {"step": int(s.steps)}, force=True)
    ck.close()
    return state.params


def two_stage_sft(params, demos: Callable[[bool], list], c, out: pathlib.Path, log: Log, *, name: str = "sft",
                  probe: Callable[[Any], dict] | None = None):
    """The SFT warm start in two stages from `params` (docs/SPEC.md §4: a short SFT before RL):

    1. `exp.sft.clean_steps` steps on correct demos, `demos(True)` (out/<name>_clean): the tiny
       byte model first learns to *copy* (a value from the prompt, a key through a summary) —
       a phase transition that imperfect demos delay or prevent;
    2. `exp.sft.steps` steps on imperfect demos, `demos(False)` (out/<name>): the copy circuit
       stays, the policy now mixes the right answer with the demonstrator's errors — RL's headroom.

    Stage 1 may pack shorter rows (`exp.sft.clean_seq_len`, `clean_batch_size`: attention cost
    grows with the row length) and use its own peak lr (`exp.sft.clean_lr`: e.g. a high one
    where the copy forms, then a lower stage 2 that keeps it). `demos` is called only for a
    stage that has no checkpoint yet; a finished out/<name> skips both. `probe` (see
    `run_sft`) runs every `exp.sft.probe_every` steps of both stages (0 or absent: never)."""
    s = c.exp.sft
    if int(s.get("clean_steps", 0)) > 0 and not (out / name).is_dir():
        params = clean_sft(params, lambda: demos(True), c, out, log, name=f"{name}_clean", probe=probe)
    return run_sft(params, lambda: demos(False), c, out, log, stage=SFTStage.from_config(c, name), probe=probe)


def clean_sft(params, rows, c, out: pathlib.Path, log: Log, *, name: str, probe=None):
    """Stage 1 of `two_stage_sft` alone: `run_sft` with `exp.sft.clean_steps` and the clean stage's
    row shape and lr (benchmarks/selfsum_scope.py times when a copy forms in it)."""
    return run_sft(params, rows, c, out, log, stage=SFTStage.from_config(c, name, clean=True), probe=probe)


def initial_params(c, key):
    """A run's starting params: `model.init_from`'s checkpoint (`hf.pretrained_params`) or
    `transformer.init(key)`."""
    if str(c.model.get("init_from", "") or ""):
        return hf.pretrained_params(c, key)
    return transformer.init(key, c.model)


def warm_start(c, family: Family, tok, out: pathlib.Path, log: Log, key_init, *, pool: SandboxPool | None = None):
    """experiments/rl.py's starting params: the SFT warm start (`config_edit_warm_start`; for the
    ``swebench`` family `swebench_warm_start`, in `pool` if given), or for a task set with
    ``exp.n_sft_tasks = 0`` (no demonstrations) the initial params (`initial_params`:
    `model.init_from` or a fresh init)."""
    if family.name == "swebench":
        if int(c.exp.n_sft_tasks) == 0:
            return initial_params(c, key_init)
        return swebench_warm_start(c, family, tok, out, log, key_init, pool=pool)
    return config_edit_warm_start(c, family, tok, out, log, key_init)


def swebench_warm_start(c, family: Family, tok, out: pathlib.Path, log: Log, key_init, *, name: str = "sft",
                        pool: SandboxPool | None = None):
    """SFT into out/<name> from `initial_params` on gold-patch demonstrations
    (`horizon.env.swe_demos`) of the first `exp.n_sft_tasks` distinct train instances, each run in its
    own image and kept only where the verifier gives it 1 (docs/REAL_REPOS.md). One stage: every
    demonstration is correct. `pool`: the run's sandboxes, borrowed (None: a pool of its own, closed
    after the demonstrations)."""
    def demos():
        tasks = list({t.id: t for t in family.tasks("train", int(c.exp.n_sft_tasks))}.values())
        boxes = pool or SandboxPool.from_config(c)
        try:
            rows, report = swe_demos.swebench_demos(family, tasks, boxes, c, tok)
        finally:
            if boxes is not pool:
                boxes.close()
        say(f"[demos] {report.line()}")
        log(dict(phase="demos", **report.record()))
        if not rows:
            raise RuntimeError(f"no demonstration reached reward 1 ({report.line()})")
        return rows
    return run_sft(initial_params(c, key_init), demos, c, out, log, stage=SFTStage.from_config(c, name))


def config_edit_warm_start(c, family: Family, tok, out: pathlib.Path, log: Log, key_init, *, name: str = "sft"):
    """experiments/rl.py's SFT stage, from `transformer.init(key_init)` into out/<name>:
    `two_stage_sft` on the same `exp.n_sft_tasks` train tasks (`horizon.env.demos.config_edit_demos`).
    Stage 1 (correct demos) is where the tiny model learns to copy the prompt's value (a phase
    transition that, on demos where half the values are wrong, came anywhere between ~600 and
    >800 steps depending on the seed); stage 2 (`exp.sft.corrupt_prob`, `exp.sft.corrupt`) adds
    the demonstrator's systematic error."""
    tasks = family.tasks("train", int(c.exp.n_sft_tasks))

    def demos(p: float):
        return config_edit_demos(tasks, tok, np.random.default_rng(int(c.seed)), corrupt_prob=p,
                                 value_range=tuple(c.exp.task.value_range), corrupt=str(c.exp.sft.corrupt))

    return two_stage_sft(initial_params(c, key_init),
                         lambda clean: demos(0.0 if clean else float(c.exp.sft.corrupt_prob)), c, out, log, name=name)


def _sft_state(params, c):
    """(the SFT train config, a fresh `lm.TrainState` of `params`): also the restore template."""
    s = c.exp.sft
    train = ml_collections.ConfigDict(s.optim.to_dict())
    train.steps = int(s.steps)            # the schedule spans this stage (checks.validate_sft: warmup < steps)
    model = ml_collections.ConfigDict(c.model.to_dict())
    if s.get("remat") is not None:        # SFT rows may not need the RL trainer's recompute
        model.remat = bool(s.remat)
    sc = ml_collections.ConfigDict(dict(model=model, train=train, mesh=c.mesh))
    opt = lm.optimizer(params, sc)
    return sc, lm.TrainState(jnp.zeros((), jnp.int32), params, opt.init(params), jax.random.PRNGKey(0))


def load_sft_params(c, directory: str | pathlib.Path):
    """The params of the finished SFT checkpoint `run_sft` wrote to `directory` (e.g.
    runs/rl_tiny/sft): the warm start other drivers (experiments/rl_async.py, eval) reuse.
    (`train.checkpoint.restore_params`, the one loader.)"""
    try:
        return restore_params(directory, c.model)[0]
    except FileNotFoundError:
        raise FileNotFoundError(f"no SFT checkpoint in {directory} (run experiments/rl.py, or run_sft, "
                                "first)") from None


def ensure_sft_checkpoint(c, directory: str | pathlib.Path) -> None:
    """Make the SFT checkpoint `directory` with experiments/rl.py's SFT stage (same seed, demos and
    init, `config_edit_warm_start`) if it is missing (experiments/rl_async.py's warm start)."""
    d = pathlib.Path(directory)
    try:
        load_sft_params(c, d)
        return
    except FileNotFoundError:
        pass
    print(f"no SFT checkpoint in {d}: running experiments/rl.py's SFT stage there", flush=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    log = MetricsWriter(d.parent, c, jsonl="sft_metrics.jsonl")
    config_edit_warm_start(c, family_from_config(c.exp), tokenizer_from_config(c), d.parent, log,
                           run_keys(c.seed)["init"], name=d.name)
    log.close()


def tok_pad(c) -> int:
    return tokenizer_from_config(c).pad_id


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
    log(e)
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
