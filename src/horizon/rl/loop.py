"""Synchronous RL on a procedural task family in sandboxes (SPEC §4, §6, §7).

The shared core of experiments/rl.py (config-edit family, `make run`) and
experiments/selfsum.py (key-recall family, three context strategies); episodes, sandboxes and
rewards come from the environment layer (`horizon.env.rollouts`: `SandboxPool`, `rollout_batch`):

- `evaluate`: `passes` sampled passes over held-out tasks; the std over passes is the
  eval noise, best-of-K = tasks solved by any pass; efficiency stats per episode;
- `run_sft`: next-token CE on demonstration rows (assistant tokens only), rows packed
  with segment ids (`horizon.data.packing`), orbax checkpoint + resume;
- `run_rl`: the synchronous loop — single-epoch prompts, `group_size` rollouts each,
  `build_batch` -> `trainer.train_step` (Dr.GRPO, KL k1, router replay), periodic eval,
  checkpoints (RLState + prompt-sampler state; a rerun resumes).

Everything reads the experiment config `c` (configs/rl_tiny.py's `exp` block): no
hyperparameter lives here.
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from horizon.data.packing import pack_sequences
from horizon.rl import batch as rlbatch
from horizon.rl import losses, prompts, sampler, trainer
from horizon.env.families import Family
from horizon.env.rollouts import SandboxPool, rollout_batch
from horizon.train import lm
from horizon.train.checkpoint import Checkpointer

Log = Callable[[dict], None]


def start_run(c: ml_collections.ConfigDict):
    """The common start of a driver, after `horizon.utils.cli.load` has parsed and validated `c`:
    the run dir `exp.out_dir` with config.json, the XLA compilation cache, tokenizer, metrics log,
    task family. Returns (out_dir, tok, log, family)."""
    from horizon.data.tokenizer import ByteTokenizer
    from horizon.env.families import family_from_config
    from horizon.utils.config import dump_config

    out_dir = pathlib.Path(c.exp.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_config(c, out_dir / "config.json")
    if c.exp.get("compilation_cache_dir"):
        jax.config.update("jax_compilation_cache_dir", str(c.exp.compilation_cache_dir))
    return out_dir, ByteTokenizer(c.model.vocab_size), JsonlLog(out_dir / "metrics.jsonl"), family_from_config(c.exp)


EFFICIENCY_KEYS = ("gen_tokens", "summaries", "summary_tokens", "tool_calls", "turns", "malformed_calls")


def evaluate(family: Family, params, tasks, pool: SandboxPool, c, tok, key, version: int) -> dict:
    """`c.exp.eval.passes` sampled passes over `tasks`: mean, std over passes (the eval noise),
    best-of-passes, per-pass means, and efficiency: mean per episode of EFFICIENCY_KEYS,
    generated tokens per solved task, summary tokens per summary."""
    ev = c.exp.eval
    holder = sampler.ParamsHolder(params, version=version)
    policy = sampler.make_policy(holder, c, key, temperature=float(ev.temperature))
    n, passes = len(pool.boxes), int(ev.passes)
    solved = np.zeros((passes, len(tasks)), np.float32)
    infos = []
    for p in range(passes):
        for i in range(0, len(tasks), n):
            chunk = tasks[i:i + n]
            _, _, inf = rollout_batch(family, chunk, policy, pool, c, tok)
            solved[p, i:i + len(chunk)] = [x["verifier"] for x in inf]
            infos += inf
    per_pass = solved.mean(axis=1)
    eff = {f"eval_{k}": float(np.mean([x[k] for x in infos])) for k in EFFICIENCY_KEYS}
    n_solved = float(solved.sum())
    eff["eval_tokens_per_solved"] = float(sum(x["gen_tokens"] for x in infos) / n_solved) if n_solved else None
    n_sum = sum(x["summaries"] for x in infos)
    eff["eval_tokens_per_summary"] = float(sum(x["summary_tokens"] for x in infos) / n_sum) if n_sum else None
    return dict(heldout_mean=float(per_pass.mean()),
                heldout_std=float(per_pass.std(ddof=1)) if passes > 1 else 0.0,
                heldout_best_of_k=float(losses.mean_group_max(solved.T)), heldout_passes=per_pass.tolist(), **eff)


# ----------------------------------------------------------------------------- SFT
def run_sft(params, rows, c, out: pathlib.Path, log: Log, *, name: str = "sft", steps: int | None = None,
            seq_len: int | None = None, batch_size: int | None = None, lr: float | None = None,
            probe: Callable[[Any], dict] | None = None, probe_every: int = 0):
    """Train `params` for `steps` (default `c.exp.sft.steps`) on demonstration `rows`
    [(tokens, loss_mask)] packed into rows of `c.exp.sft.seq_len` (optimizer `c.exp.sft.optim`,
    schedule sized to `steps`); resumes from out/<name> if a finished checkpoint is there.
    `rows` may be a zero-argument callable, called only when there is no checkpoint.
    `steps`, `seq_len`, `batch_size` (and `lr`, the peak of `c.exp.sft.optim`) override
    `c.exp.sft`'s for this call only. `probe(params) -> {name: float}`, if given, runs every
    `probe_every` steps and at the end, and its numbers join the log record (e.g. selfsum's
    key-copy accuracy, to see when a copy forms); it reads the params only."""
    s = c.exp.sft
    over = {k: int(v) for k, v in dict(steps=steps, seq_len=seq_len, batch_size=batch_size).items() if v is not None}
    if over or lr is not None:
        c = ml_collections.ConfigDict(c.to_dict())
        c.exp.sft.update(over)
        if lr is not None:
            c.exp.sft.optim.lr = float(lr)
        s = c.exp.sft
    sc, state = _sft_state(params, c)
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
    step_fn = lm.jit_train_step(sc)
    print(f"{name}: {len(rows)} demo rows packed into {packed.num_rows} rows of {s.seq_len} tokens "
          f"({packed.lengths.sum() / packed.tokens.size:.0%} full)", flush=True)
    t0 = time.time()
    for i in range(int(s.steps)):
        idx = rng.choice(packed.num_rows, B, replace=False)
        b = dict(tokens=packed.tokens[idx], segment_ids=packed.segment_ids[idx], positions=packed.positions[idx],
                 mask=packed.extras["mask"][idx])
        state, m = step_fn(state, {k: jnp.asarray(v) for k, v in b.items()})
        last = i + 1 == int(s.steps)
        probed = probe is not None and probe_every > 0 and ((i + 1) % probe_every == 0 or last)
        if (i + 1) % int(s.log_every) == 0 or last or probed:
            rec = dict(phase=name, step=i + 1, loss=float(m["loss"]), wall_s=time.time() - t0)
            extra = probe(state.params) if probed else {}
            log(dict(rec, **extra))
            print(f"{name} {i + 1}/{s.steps}: loss {rec['loss']:.4f} ({rec['wall_s']:.0f}s)"
                  + "".join(f", {k} {v:.3f}" for k, v in extra.items()), flush=True)
    ck.save(int(s.steps), state, {"step": int(s.steps)}, force=True)
    ck.close()
    return state.params


def two_stage_sft(params, demos: Callable[[bool], list], c, out: pathlib.Path, log: Log, *, name: str = "sft",
                  probe: Callable[[Any], dict] | None = None):
    """The SFT warm start in two stages from `params` (SPEC §4: a short SFT before RL):

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
    n_clean = int(s.get("clean_steps", 0))
    pr = dict(probe=probe, probe_every=int(s.get("probe_every", 0) or 0))
    if n_clean > 0 and not (out / name).is_dir():
        params = run_sft(params, lambda: demos(True), c, out, log, name=f"{name}_clean", steps=n_clean,
                         seq_len=s.get("clean_seq_len"), batch_size=s.get("clean_batch_size"), lr=s.get("clean_lr"),
                         **pr)
    return run_sft(params, lambda: demos(False), c, out, log, name=name, **pr)


def config_edit_warm_start(c, family: Family, tok, out: pathlib.Path, log: Log, key_init, *, name: str = "sft"):
    """experiments/rl.py's SFT stage, from `transformer.init(key_init)` into out/<name>:
    `two_stage_sft` on the same `exp.n_sft_tasks` train tasks (`horizon.env.demos.config_edit_demos`).
    Stage 1 (correct demos) is where the tiny model learns to copy the prompt's value (a phase
    transition that, on demos where half the values are wrong, came anywhere between ~600 and
    >800 steps depending on the seed); stage 2 (`exp.sft.corrupt_prob`, `exp.sft.corrupt`) adds
    the demonstrator's systematic error."""
    from horizon.model import transformer
    from horizon.env.demos import config_edit_demos

    tasks = family.tasks("train", int(c.exp.n_sft_tasks))

    def demos(p: float):
        return config_edit_demos(tasks, tok, np.random.default_rng(int(c.seed)), corrupt_prob=p,
                                 value_range=tuple(c.exp.task.value_range), corrupt=str(c.exp.sft.corrupt))

    return two_stage_sft(transformer.init(key_init, c.model),
                         lambda clean: demos(0.0 if clean else float(c.exp.sft.corrupt_prob)), c, out, log, name=name)


def _sft_state(params, c):
    """(the SFT train config, a fresh `lm.TrainState` of `params`): also the restore template."""
    s = c.exp.sft
    train = ml_collections.ConfigDict(s.optim.to_dict())
    train.steps = int(s.steps)            # the schedule spans this stage (checks.validate_sft: warmup < steps)
    sc = ml_collections.ConfigDict(dict(model=c.model, train=train))
    opt = lm.optimizer(params, sc)
    return sc, lm.TrainState(jnp.zeros((), jnp.int32), params, opt.init(params), jax.random.PRNGKey(0))


def load_sft_params(c, directory: str | pathlib.Path):
    """The params of the finished SFT checkpoint `run_sft` wrote to `directory` (e.g.
    runs/rl_tiny/sft): the warm start other drivers (experiments/rl_async.py, eval) reuse.
    (`train.checkpoint.restore_params`, the one loader.)"""
    from horizon.train.checkpoint import restore_params

    try:
        return restore_params(directory, c.model)[0]
    except FileNotFoundError:
        raise FileNotFoundError(f"no SFT checkpoint in {directory} (run experiments/rl.py, or run_sft, first)") from None


def ensure_sft_checkpoint(c, directory: str | pathlib.Path) -> None:
    """Make the SFT checkpoint `directory` with experiments/rl.py's SFT stage (same seed, demos and
    init, `config_edit_warm_start`) if it is missing (experiments/rl_async.py's warm start)."""
    from horizon.data.tokenizer import ByteTokenizer
    from horizon.env.families import family_from_config
    from horizon.utils.seeds import run_keys

    d = pathlib.Path(directory)
    try:
        load_sft_params(c, d)
        return
    except FileNotFoundError:
        pass
    print(f"no SFT checkpoint in {d}: running experiments/rl.py's SFT stage there", flush=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    log = JsonlLog(d.parent / "sft_metrics.jsonl")
    config_edit_warm_start(c, family_from_config(c.exp), ByteTokenizer(c.model.vocab_size), d.parent, log,
                           run_keys(c.seed)["init"], name=d.name)
    log.close()


def tok_pad(c) -> int:
    from horizon.data.tokenizer import ByteTokenizer

    return ByteTokenizer(c.model.vocab_size).PAD


# ----------------------------------------------------------------------------- RL
def run_rl(params, family: Family, pool: SandboxPool, c, tok, out: pathlib.Path, log: Log, key, heldout,
           *, tag: str = "") -> dict:
    """The synchronous RL loop (module docstring) from `params`; evaluates on `heldout` at step 0,
    every `exp.eval.every` steps and at the end. Returns {"evals": {step: eval}, "state": RLState}."""
    steps, G, P = int(c.exp.steps), int(c.rl.group_size), int(c.rl.prompts_per_step)
    k_pol, k_eval = jax.random.split(key)
    rl_seeds = family.seeds("train", steps * P, int(c.exp.n_sft_tasks))
    tasks = {t.id: t for t in map(family.make_task, rl_seeds)}
    psamp = prompts.sampler_from_config(sorted(tasks), c.rl, seed=int(c.seed))
    # train_step donates its state: copy, so the caller's `params` (e.g. one SFT checkpoint shared
    # by several runs, experiments/selfsum.py) stay valid
    state = trainer.init_state(jax.tree.map(jnp.copy, params), c)
    ck = Checkpointer(out / "ckpt", every=int(c.rl.checkpoint_every), keep=int(c.rl.max_checkpoints))
    start = 0
    got = ck.restore_latest(state)
    if got is not None:
        state, meta = got
        start = int(meta["step"])
        psamp = prompts.PromptSampler.from_state_dict(meta["prompt_sampler"])
        print(f"{tag}RL: resumed at step {start}", flush=True)
    holder = sampler.ParamsHolder(state.params, version=start)
    policy = sampler.make_policy(holder, c, k_pol)
    evals = {}

    def do_eval(step):
        t0 = time.time()
        e = evaluate(family, state.params, heldout, pool, c, tok, jax.random.fold_in(k_eval, step), step)
        e.update(phase="eval", step=step, eval_s=time.time() - t0, **({"run": tag.strip(": ")} if tag else {}))
        log(e)
        evals[step] = e
        print(f"{tag}eval @ {step}: held-out {e['heldout_mean']:.3f} ± {e['heldout_std']:.3f} "
              f"(passes {['%.3f' % x for x in e['heldout_passes']]}), best-of-{c.exp.eval.passes} "
              f"{e['heldout_best_of_k']:.3f} ({e['eval_s']:.0f}s)", flush=True)

    if start == 0:
        do_eval(0)
    t_start = time.time()
    for step in range(start, steps):
        t0 = time.time()
        ids = psamp.sample(P, step)
        if len(ids) < P:
            print(f"{tag}prompt set exhausted (single epoch): stopping", flush=True)
            break
        batch_tasks = [tasks[i] for i in ids for _ in range(G)]
        trajs, rs, infos = rollout_batch(family, batch_tasks, policy, pool, c, tok)
        for t, tr in zip(batch_tasks, trajs):
            psamp.record_rollout(t.id, turns=tr.stats["turns"], thinking_tokens=tr.stats["thinking_tokens"])
        t_roll = time.time() - t0
        groups = [trajs[g * G:(g + 1) * G] for g in range(P)]
        b = rlbatch.build_batch_from_config(groups, np.asarray(rs, np.float32).reshape(P, G), c)
        t1 = time.time()
        state, m = trainer.train_step(state, b, cfg=c)
        holder.update(state.params, version=step + 1)
        rec = {k: float(v) for k, v in jax.device_get(m).items()}
        gen = sum(tr.num_generated_tokens for tr in trajs)
        rec.update(phase="rl", step=step + 1, group_size=G, rollout_s=t_roll, train_s=time.time() - t1,
                   step_s=time.time() - t0, gen_tokens_per_s=gen / max(t_roll, 1e-9),
                   success=float(np.mean([i["verifier"] for i in infos])),
                   malformed=float(np.mean([i["malformed_calls"] > 0 for i in infos])),
                   summaries=float(np.mean([i["summaries"] for i in infos])),
                   **({"run": tag.strip(": ")} if tag else {}),
                   **{f"batch/{k}": v for k, v in rlbatch.batch_stats(b).items()})
        log(rec)
        print(f"{tag}step {step + 1}/{steps}: reward {rec['reward_mean']:.3f} best-of-{G} {rec['best_of_k']:.3f} "
              f"success {rec['success']:.3f} malformed {rec['malformed']:.2f} kl {rec.get('kl_k1', 0.0):.2e} "
              f"gen {rec['gen_tokens_per_s']:.0f} tok/s rollout {t_roll:.1f}s train {rec['train_s']:.1f}s "
              f"({time.time() - t_start:.0f}s)", flush=True)
        ck.save(step + 1, state, {"step": step + 1, "prompt_sampler": psamp.state_dict()}, force=step + 1 == steps)
        every = int(c.exp.eval.every)
        if step + 1 < steps and every > 0 and (step + 1) % every == 0:
            do_eval(step + 1)
    final = int(jax.device_get(state.step))
    if final not in evals:
        do_eval(final)
    ck.close()
    return {"evals": evals, "state": state}


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


class JsonlLog:
    """Append-only JSONL metrics (one record per call, with wall time since start); keeps records."""

    def __init__(self, path: pathlib.Path):
        self.t0 = time.time()
        self.records: list[dict] = []
        self.f = open(path, "a")

    def __call__(self, rec: dict) -> None:
        rec = dict(rec, time_s=time.time() - self.t0)
        self.records.append(rec)
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()

    def close(self):
        self.f.close()
