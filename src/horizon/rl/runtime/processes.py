"""The async runtime's process mains (docs/SPEC.md §4, §4.1; the design: `orchestrator`'s doc):

- `trainer_main`: consume the groups of step t from the GroupStore (slot order), `train_groups`,
  checkpoint, publish version t+1 (`weight_sync`); one process, or process i of a trainer group
  joined by jax.distributed (`distributed`);
- `rollout_worker_main`: take a generation batch from its queue, load the newest weights,
  `rollout_groups` with in-flight weight updates, write each group to the GroupStore;
- `sync_main`: experiments/rl_async.py's synchronous baseline, `loop.run_rl` itself, run in a
  child with the same XLA flags and threads (`run_child`, a spawned local process).

Each is started in a fresh process whose environment (`async_setup.child_env`) is set before it
starts: by Ray's runtime_env (`ray_pool.RayPool`) or by `spawn`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pathlib
import time

import jax
import numpy as np

from horizon.data.tokenizer import tokenizer_from_config
from horizon.model.params import numpy_init
from horizon.rl.runtime import core as runtime
from horizon.rl.runtime import distributed, remote, storage, weight_sync, workers
from horizon.rl.runtime.async_setup import append_jsonl, child_env, data_root, initial_params, make_publisher, setup_jax
from horizon.rl.runtime.loop import run_rl, sandbox_use
from horizon.rl.runtime.pools import docker_host_for
from horizon.utils.tracking import MetricsWriter


def token_staleness(groups_records, step: int) -> dict[int, int]:
    """Histogram {staleness: token count} of `step - token version` over the model tokens
    (`runtime.token_staleness`)."""
    return {int(k): int(n) for k, n in zip(*np.unique(runtime.token_staleness(groups_records, step),
                                                        return_counts=True))}


# ----------------------------------------------------------------------------- trainer process
def trainer_main(cfg, run_dir: str, num_steps: int, dist: tuple[str, int, int] | None = None) -> None:
    """Trainer process: consume groups of step t (slot order), train, checkpoint, publish t+1.
    With `dist` = (coordinator, n, i) it is process i of a trainer group (`distributed.join`): every
    process reads the same groups and runs the same step on the global mesh; process 0 logs and
    publishes, and no process returns before it has published the last version."""
    main = distributed.join(dist)
    setup_jax(cfg)
    a = cfg.async_
    run = pathlib.Path(run_dir)
    N = int(cfg.rl.prompts_per_step)
    data = data_root(cfg, run)
    store = storage.GroupStore(f"{data}/groups")
    log = run / "trainer.jsonl" if main else None
    writer = MetricsWriter(run, cfg, jsonl="trainer.jsonl") if main else None     # its step records + histograms
    state, ckpt, meta = runtime.resume_rl_state(initial_params(cfg), cfg, run / "ckpt")
    start = 0 if meta is None else int(meta["step"])
    apub = None
    if main:
        pub = make_publisher(cfg, f"{data}/weights")
        pub.resume()
        apub = weight_sync.AsyncPublisher(pub)
    publish = distributed.group_publisher(apub, dist is not None)
    publish(state.params, start)          # version `start` (re-publish = bit-identity check)
    if apub is not None:
        apub.wait()
    append_jsonl(log, dict(event="start", pid=os.getpid(), step=start, restored=meta is not None, time=time.time(),
                           processes=1 if dist is None else int(dist[1]), **distributed.device_counts()))
    for step in range(start, num_steps):
        slots = range(step * N, (step + 1) * N)
        t0 = time.time()
        while not all(store.has(s) for s in slots):
            time.sleep(float(a.poll_s))
        t_wait = time.time() - t0
        recs = [store.get(s) for s in slots]
        state, m, _ = runtime.train_groups(state, recs, cfg)
        t_train = time.time() - t0 - t_wait
        ckpt.save(step + 1, state, {"step": step + 1}, force=step + 1 == num_steps)
        if (step + 1) % int(a.publish_every) == 0 or step + 1 == num_steps:
            publish(state.params, step + 1)
        stats = list(apub.stats) if apub is not None else []
        if writer is not None:
            writer(_step_record(step, slots, recs, m, stats, wait_s=t_wait, train_s=t_train))
            writer.histograms(step + 1, runtime.step_histograms(recs, step), phase="trainer")
    if apub is not None:
        apub.close()
    ckpt.close()
    distributed.barrier("trainer done", dist is not None)    # the last version is out before any exits
    append_jsonl(log, dict(event="done", pid=os.getpid(), step=num_steps, time=time.time()))
    if writer is not None:
        writer.close()


def _step_record(step: int, slots, recs, m: dict, stats: list, *, wait_s: float, train_s: float) -> dict:
    """trainer.jsonl's record of step `step` (trained on `slots`' groups `recs`, metrics `m`;
    `stats`: the publisher's), with the groups' sandbox time split as the sync loop's (`sandbox_use`)."""
    return dict(event="step", phase="trainer", step=step + 1, slots=list(slots), pid=os.getpid(), time=time.time(),
                wait_s=wait_s, train_s=train_s, reward_mean=m["reward_mean"],
                staleness=token_staleness(recs, step), group_min_versions=[r.min_version for r in recs],
                generated_tokens=int(sum(r.generated_tokens for r in recs)),
                publish=[dict(version=s.version, kind=s.kind, ratio=s.ratio, bytes=s.file_bytes,
                              seconds=s.seconds) for s in stats[-2:]],
                **sandbox_use([i for r in recs for i in r.infos]),
                **{k: m[k] for k in m if k in ("loss", "grad_norm", "entropy", "sampler_logprob_diff",
                                               "sampler_logprob_diff_max")
                   or k.startswith(("pack/", "infra/", "routing/"))})


# ----------------------------------------------------------------------------- rollout process
def rollout_worker_main(worker_id: int, cfg, run_dir: str, requests, events) -> None:
    """Rollout worker: a generation batch of slot requests -> newest weights -> `runtime.rollout_groups`
    (in-flight updates) -> GroupStore."""
    setup_jax(cfg)
    a = cfg.async_
    run = pathlib.Path(run_dir)
    if host := docker_host_for(a.get("docker_hosts", ""), node_ip()):
        os.environ["DOCKER_HOST"] = host      # read when this process makes its Docker client
    tok = tokenizer_from_config(cfg)
    served = remote.is_remote(cfg)                    # the server loads each version itself (docs/SERVING.md)
    template = None if served else jax.eval_shape(lambda: numpy_init(cfg.model, 0))
    data = data_root(cfg, run)
    source = workers.WeightSource(f"{data}/weights", template, min_interval_s=float(a.weight_poll_interval_s))
    store = storage.GroupStore(f"{data}/groups")
    env = workers.ENVS[runtime.env_name(cfg)](cfg)       # this worker's environment (its pooled sandboxes)
    name = f"w{worker_id}"
    try:
        while (reqs := requests.get()) is not None:      # one item = one generation batch (runtime docstring)
            for r in reqs:
                events.put(dict(kind="generating", slot=int(r["slot"]), worker=name, time=time.time()))
            source.wait_for(max(int(r["min_version"]) for r in reqs), float(a.weights_timeout_s))
            recs, info = runtime.rollout_groups(env, reqs, source.poll, cfg, tok, worker=name,
                                                push=remote.already_published if served else None)
            for rec in recs:
                events.put(dict(kind="scored", slot=rec.slot, worker=name, time=time.time()))
                wrote = store.put(rec)
                events.put(dict(kind="grouped", slot=rec.slot, worker=name, time=time.time(), wrote=wrote,
                                tokens=rec.generated_tokens, seconds=rec.seconds, min_version=rec.min_version,
                                max_version=rec.max_version, start_version=rec.start_version,
                                switches=info["switches"], reward=float(np.mean(rec.rewards)),
                                success=float(np.mean([i.get("verifier", i.get("reward", 0.0)) for i in rec.infos]))))
    finally:
        env.close()


def node_ip() -> str:
    """This process's node address as Ray names it (`async_.docker_hosts` keys)."""
    import ray  # noqa: PLC0415  (optional heavy dependency: only a process inside Ray calls this)

    return ray.util.get_node_ip_address()


# ----------------------------------------------------------------------------- local child processes
def spawn(ctx, env: dict[str, str], target, args):
    """Start `target(*args)` in a daemon child of `ctx` with `env` added to its environment."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)       # spawn children inherit the parent's environment
    try:
        p = ctx.Process(target=target, args=args, daemon=True)
        p.start()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return p


def run_child(cfg, target, *args) -> None:
    """Run `target(*args)` in a spawned child with the XLA flags and threads of the runtime's
    processes (`child_env`) and wait for it; raises if it fails."""
    p = spawn(mp.get_context("spawn"), child_env(cfg), target, args)
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"{getattr(target, '__name__', target)} exited with code {p.exitcode}")


def sync_main(cfg, run_dir: str) -> None:
    """experiments/rl_async.py's synchronous baseline: `loop.run_rl` (the one loop) on the
    runtime's environment from `initial_params(cfg)`, `exp.steps` steps, logging to
    run_dir/metrics.jsonl, checkpointing to run_dir/ckpt and keeping its groups in run_dir/groups
    (the async layout); run it with `run_child`."""
    setup_jax(cfg)
    run = pathlib.Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    env = workers.ENVS[runtime.env_name(cfg)](cfg)
    log = MetricsWriter(run, cfg)
    try:
        run_rl(initial_params(cfg), env, cfg, tokenizer_from_config(cfg), run, log,
               store=storage.GroupStore(f"{data_root(cfg, run)}/groups"))
    finally:
        env.close()
        log.close()
