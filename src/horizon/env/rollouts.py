"""Episodes of a task family in pooled sandboxes: the environment side of a rollout (SPEC §4, §5, §7).

- `SandboxPool`: sandboxes created once (in threads) and reset per episode with one exec;
- `rollout_batch`: one episode per task through the agent loop (`run_episodes`: batched
  generation, tool calls in threads), then the verifier and `rewards.total_reward`;
- `ExperimentEnv`: an experiment config's family and a pool, made on first use and closed by
  its owner (the sync loop and each async rollout worker hold one); `eval_setup` lends the pool
  to the eval harness (one evaluator).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from horizon.agent import Segment, run_episodes
from horizon.env.families import Family, family_from_config, make_episode
from horizon.rl.maths import rewards
from horizon.tasks import verify


class SandboxPool:
    """`n` sandboxes of `backend` created in parallel and reused across episodes."""

    def __init__(self, n: int, backend: str, *, cpus: float, mem: str, workers: int, image: str):
        from horizon.sandbox import open_sandbox

        self.workers = int(workers)
        limits = dict(cpus=float(cpus), mem_limit=str(mem)) if backend == "docker" else {}
        image = image if backend == "docker" else None
        if backend == "docker":   # sandboxes are made in worker threads: install SIGTERM cleanup here
            from horizon.sandbox.docker import install_cleanup_hooks

            install_cleanup_hooks()
        with ThreadPoolExecutor(self.workers) as ex:
            self.boxes = list(ex.map(lambda _: open_sandbox(backend, image, **limits), range(int(n))))

    @classmethod
    def from_config(cls, c, n: int | None = None) -> "SandboxPool":
        e = c.exp
        return cls(int(n or e.pool_size), e.backend, cpus=e.sandbox_cpus, mem=e.sandbox_mem,
                   workers=int(c.agent.num_tool_workers), image=str(e.sandbox_image))

    def map(self, fn, *its):
        with ThreadPoolExecutor(self.workers) as ex:
            return list(ex.map(fn, *its))

    def close(self):
        try:
            self.map(lambda b: b.close(), self.boxes)
        except RuntimeError:        # at interpreter exit (atexit) no new threads: one by one
            for b in self.boxes:
                b.close()


def trim_segment(seg: Segment) -> Segment:
    """Drop tokens after the last model token (the final observation): they carry no loss and,
    the model being causal, do not change any trained log-prob; keeps rows in fewer buckets."""
    hit = np.nonzero(np.asarray(seg.loss_mask))[0]
    n = int(hit[-1]) + 1 if len(hit) else len(seg.tokens)
    ri = None if seg.router_indices is None else seg.router_indices[:, :n]
    return Segment(seg.tokens[:n], seg.loss_mask[:n], seg.logprobs[:n], seg.policy_versions[:n], ri)


def rollout_batch(family: Family, tasks, policy, pool: SandboxPool, c, tok):
    """One episode per task (len(tasks) <= pool size) -> (trajectories, rewards, infos)."""
    if len(tasks) > len(pool.boxes):
        raise ValueError(f"{len(tasks)} tasks for a pool of {len(pool.boxes)} sandboxes")
    boxes = pool.boxes[:len(tasks)]
    pool.map(family.reset, boxes, tasks)
    eps = [make_episode(family, t, sb, tok, c.agent) for t, sb in zip(tasks, boxes)]
    trajs = run_episodes(policy, eps, num_tool_workers=pool.workers)
    for tr in trajs:
        tr.segments = [trim_segment(sg) for sg in tr.segments]
    vs = pool.map(lambda t, sb, tr: verify(t, sb, tr.final_answer, timeout=float(c.exp.verify_timeout_s),
                                           check_edits=family.check_edits), tasks, boxes, trajs)
    rs, infos = [], []
    for tr, v in zip(trajs, vs):
        r, info = rewards.total_reward(v.reward, tr.stats, c.rl)
        rs.append(float(r))
        infos.append(dict(info, verifier=v.reward, end=tr.end_reason, gen_tokens=tr.num_generated_tokens, **tr.stats))
    return trajs, rs, infos


class ExperimentEnv:
    """The task family of an experiment config (`cfg.exp`) and a pool of reused sandboxes, made
    on first use (`exp.pool_size`, `exp.backend`, `exp.sandbox_image`); the owner closes it.
    `seed_of(request)` is the task seed of a rollout request. A `pool` passed in is borrowed
    (several envs of one driver share it, e.g. experiments/selfsum.py's strategies): `close`
    leaves it open."""

    def __init__(self, cfg, seed_of: Callable[[dict], int], *, pool: SandboxPool | None = None):
        self.cfg = cfg
        self.seed_of = seed_of
        self.family = family_from_config(cfg.exp)
        self._pool: SandboxPool | None = pool
        self._owns_pool = pool is None

    @property
    def pool(self) -> SandboxPool:
        if self._pool is None:
            self._pool = SandboxPool.from_config(self.cfg)
        return self._pool

    def rollouts(self, requests: Sequence[dict], policy, tok) -> list[tuple]:
        """All `len(requests) * group_size` rollouts in ONE batched generation. Returns one
        (trajectories, rewards, infos) per request."""
        G = int(self.cfg.rl.group_size)
        tasks = [self.family.make_task(self.seed_of(r)) for r in requests for _ in range(G)]
        trajs, rs, infos = rollout_batch(self.family, tasks, policy, self.pool, self.cfg, tok)
        return [(trajs[i * G:(i + 1) * G], rs[i * G:(i + 1) * G], infos[i * G:(i + 1) * G])
                for i in range(len(requests))]

    def eval_setup(self, tok, passes: int):
        """A `horizon.eval.harness.EvalSetup` that runs the harness in this env's pooled sandboxes:
        `open_fn` lends a free sandbox reset for the task, `release_fn` takes it back; episodes and
        verification are the family's (the RL loop's periodic eval, `loop.heldout_evaluator`)."""
        import queue

        from horizon.eval.harness import EvalSetup

        c, fam, pool = self.cfg, self.family, self.pool
        free: queue.SimpleQueue = queue.SimpleQueue()
        for b in pool.boxes:
            free.put(b)

        def lend(task):
            sb = free.get_nowait()      # the harness never opens more than max_parallel = the pool's size
            fam.reset(sb, task)
            return sb

        return EvalSetup(agent_cfg=c.agent, tokenizer=tok, registry_fn=None, num_passes=int(passes),
                         max_parallel=len(pool.boxes), backend=str(c.exp.backend),
                         verify_timeout_s=float(c.exp.verify_timeout_s), open_fn=lend, release_fn=free.put,
                         episode_fn=lambda t, sb: make_episode(fam, t, sb, tok, c.agent), check_edits=fam.check_edits)

    def close(self) -> None:
        if self._pool is not None and self._owns_pool:
            self._pool.close()
        self._pool = None
