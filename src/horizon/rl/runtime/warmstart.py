"""SFT warm starts before RL (docs/SPEC.md §4: a short SFT before RL): `run_sft` (next-token CE on
demonstration rows, assistant tokens only, rows packed with segment ids by `horizon.data.packing`,
orbax checkpoint + resume), its stages (`SFTStage`, `two_stage_sft`), and the warm start of each
family (`warm_start`: config-edit demos, gold-patch demos on real repositories, or the initial
params). Everything reads the experiment config `c`: no hyperparameter lives here.
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
from horizon.env.rollouts import SandboxPool
from horizon.model import hf, transformer
from horizon.parallel import mesh as pmesh
from horizon.rl.runtime.loop import Log
from horizon.tasks.swebench import load_swebench
from horizon.train import lm
from horizon.train.checkpoint import Checkpointer, init_checkpoint_step, restore_params
from horizon.utils import compiles
from horizon.utils.progress import progress, say
from horizon.utils.seeds import run_keys
from horizon.utils.tracking import MetricsWriter


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
    """A run's starting params: `model.init_from`'s checkpoint (`hf.pretrained_params`), the step
    `model.init_step` of a horizon run's checkpoints (`model.init_checkpoint`: e.g. a pretraining budget,
    `train.save_steps`) or `transformer.init(key)`."""
    if str(c.model.get("init_from", "") or ""):
        return hf.pretrained_params(c, key)
    if str(c.model.get("init_checkpoint", "") or ""):
        return restore_params(str(c.model.init_checkpoint), c.model, step=init_checkpoint_step(c.model))[0]
    return transformer.init(key, c.model)


def warm_start(c, family: Family, tok, out: pathlib.Path, log: Log, key_init, *, pool: SandboxPool | None = None,
               demos: Callable[[bool], list] | None = None):
    """experiments/rl.py's starting params: the SFT warm start (`config_edit_warm_start`; for the
    ``swebench`` family `swebench_warm_start`, in `pool` if given; for a family whose demonstrations
    the caller brings, `demos` (`two_stage_sft`'s: the key-recall families'
    `horizon.studies.selfsum.warm_start_demos`), `two_stage_sft` on them), or for a task set with
    ``exp.n_sft_tasks = 0`` (no demonstrations) the initial params (`initial_params`:
    `model.init_from` or a fresh init). With ``exp.sft.init_from`` set, the finished SFT checkpoint
    there instead (made there first if missing, `ensure_sft_checkpoint`; not for swebench)."""
    shared = str(c.exp.sft.get("init_from", "") or "")
    if shared:                  # one SFT checkpoint for every arm of a study (made here if it is missing)
        if family.name != "swebench":
            ensure_sft_checkpoint(c, shared, demos=demos)
        return load_sft_params(c, shared)
    if demos is not None:
        return two_stage_sft(initial_params(c, key_init), demos, c, out, log)
    if family.name == "swebench":
        if int(c.exp.n_sft_tasks) == 0:
            return initial_params(c, key_init)
        return swebench_warm_start(c, family, tok, out, log, key_init, pool=pool)
    return config_edit_warm_start(c, family, tok, out, log, key_init)


def swebench_warm_start(c, family: Family, tok, out: pathlib.Path, log: Log, key_init, *, name: str = "sft",
                        pool: SandboxPool | None = None):
    """SFT into out/<name> from `initial_params` on gold-patch demonstrations
    (`horizon.env.swe_demos`) of the first `exp.n_sft_tasks` distinct train instances, each run in its
    own image and kept only where the verifier gives it 1 (docs/REAL_REPOS.md), in `two_stage_sft`'s
    stages (every demonstration is correct, so both stages train on the same rows). Demonstrations
    are saved to out/demos.npz and reused by a rerun of the same instances and agent. With
    `exp.sft.probe_every` > 0, `swe_demos.turn_probe` (greedy, and at `rl.sampler.temperature`)
    runs on the demonstrations of `exp.sft.probe_path`'s instances (out/probe_demos.npz; never
    trained on). `pool`: the run's sandboxes, borrowed (None: a pool of its own, closed after the demonstrations)."""
    def demos(tasks, path: pathlib.Path, what: str):
        key = swe_demos.demo_key(tasks, c)
        got = swe_demos.load_rows(path, key)
        if got is not None:
            say(f"[{what}] {len(got[0])} rows from {path} (demos/kept {got[1]['demos/kept']})")
            return got[0]
        boxes = pool or SandboxPool.from_config(c)
        try:
            rows, report = swe_demos.swebench_demos(family, tasks, boxes, c, tok)
        finally:
            if boxes is not pool:
                boxes.close()
        say(f"[{what}] {report.line()}")
        log(dict(phase=what, **report.record()))
        if not rows:
            raise RuntimeError(f"no demonstration reached reward 1 ({report.line()})")
        swe_demos.save_rows(path, rows, key, report)
        return rows
    s, train, turns = c.exp.sft, [], []

    def rows(_clean: bool):
        if not train:
            train.extend(demos(list({t.id: t for t in family.tasks("train", int(c.exp.n_sft_tasks))}.values()),
                               out / "demos.npz", "demos"))
        return train

    def probe(params):
        if not turns:
            turns.extend(swe_demos.agent_turns(demos(load_swebench(str(s.probe_path)), out / "probe_demos.npz",
                                                     "probe_demos"), int(s.get("probe_turns", 96))))
        sampled = swe_demos.turn_probe(params, turns, c, tok, temperature=float(c.rl.sampler.temperature))
        return dict(swe_demos.turn_probe(params, turns, c, tok), **{f"sampled_{k}": v for k, v in sampled.items()})
    with_probe = int(s.get("probe_every", 0) or 0) > 0 and str(s.get("probe_path", "") or "")
    return two_stage_sft(initial_params(c, key_init), rows, c, out, log, name=name, probe=probe if with_probe else None)


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


def ensure_sft_checkpoint(c, directory: str | pathlib.Path, *, demos: Callable[[bool], list] | None = None) -> None:
    """Make the SFT checkpoint `directory` with experiments/rl.py's SFT stage (same seed and init;
    `config_edit_warm_start`, or `two_stage_sft` on `demos`) if it is missing (experiments/rl_async.py's
    warm start; a study's shared checkpoint, `exp.sft.init_from`)."""
    d = pathlib.Path(directory)
    try:
        load_sft_params(c, d)
        return
    except FileNotFoundError:
        pass
    print(f"no SFT checkpoint in {d}: running experiments/rl.py's SFT stage there", flush=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    log = MetricsWriter(d.parent, c, jsonl="sft_metrics.jsonl")
    if demos is None:
        config_edit_warm_start(c, family_from_config(c.exp), tokenizer_from_config(c), d.parent, log,
                               run_keys(c.seed)["init"], name=d.name)
    else:
        two_stage_sft(initial_params(c, run_keys(c.seed)["init"]), demos, c, d.parent, log, name=d.name)
    log.close()


def tok_pad(c) -> int:
    return tokenizer_from_config(c).pad_id
