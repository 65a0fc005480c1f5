"""Infrastructure failures never kill a run or become the policy's reward
(docs/SPEC.md §4.1 "infrastructure is not the policy").

Unit level (no Docker): a tool or verifier hitting `SandboxInfraError` ends the episode "infra"
with no observation and no score; `rollout_groups` replaces a group whose sandboxes keep failing
by the slot's reserve prompt and stops with a one-line error when the reserve is spent; the eval
harness reruns an infra episode. End to end (Docker): 4 RL steps while a thread `docker kill`s a
pooled container every step.
"""

from __future__ import annotations

import pathlib
import threading

import numpy as np
import pytest

from horizon.agent import Episode, Generation, Segment, Trajectory
from horizon.data.tokenizer import ByteTokenizer
from horizon.rl.runtime import core as runtime
from horizon.sandbox import SandboxInfraError
from horizon.tasks import verify
from horizon.tasks.synthetic import make_synthetic_task, synthetic_registry
from horizon.utils.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


class DeadSandbox:
    """A sandbox whose container is gone: every operation raises `SandboxInfraError`."""

    def exec(self, cmd, timeout=None, workdir="/workspace"):
        raise SandboxInfraError("sandbox container abc no longer exists")

    def read_file(self, path):
        raise SandboxInfraError("sandbox container abc no longer exists")

    def write_file(self, path, data, mode=0o644):
        raise SandboxInfraError("sandbox container abc no longer exists")


def _cfg():
    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    c.model.num_layers, c.model.d_model = 2, 32
    return c


def _call_turn(tok, text):
    toks = np.asarray(tok.encode(text) + [tok.END_TURN], np.int32)
    return Generation(toks, np.zeros(len(toks), np.float32))


def test_dead_sandbox_ends_the_episode_infra_and_is_not_scored():
    c = _cfg()
    tok = ByteTokenizer(c.model.vocab_size)
    task = make_synthetic_task(3)
    ep = Episode(task, DeadSandbox(), synthetic_registry(), tok, c.agent)
    ep.step(_call_turn(tok, "<function=set><parameter=name>X</parameter><parameter=value>3</parameter></function>"))
    tr = ep.trajectory()
    assert tr.end_reason == "infra" and tr.infra and "no longer exists" in tr.failure
    # the failed call's text never became an observation the policy would be trained to react to
    assert all("no longer exists" not in tok.decode(s.tokens) for s in tr.segments)
    v = verify(task, DeadSandbox(), "")
    assert v.infra and "no longer exists" in v.infra_error


class FlakyEnv:
    """Groups of prompt ids in `broken` come back `group_failed` (their sandboxes kept dying)."""

    def __init__(self, broken):
        self.broken, self.calls = set(broken), []
        self.counters = {"infra_episodes": 0, "group_retries": 0, "sandboxes_replaced": 0}

    def rollouts(self, requests, policy, tok):
        self.calls.append([r["prompt_id"] for r in requests])
        out = []
        for r in requests:
            bad = r["prompt_id"] in self.broken
            self.counters["infra_episodes"] += 2 * bad
            self.counters["sandboxes_replaced"] += 2 * bad
            seg = Segment(np.arange(4, dtype=np.int32), np.array([0, 0, 1, 1], bool), np.zeros(4, np.float32),
                          np.zeros(4, np.int32))
            trajs = [Trajectory(r["prompt_id"], [seg], "", {"turns": 1, "thinking_tokens": 0},
                                "infra" if bad else "final") for _ in range(2)]
            infos = [dict(infra=bad, group_failed=bad, failure="dead" if bad else "") for _ in range(2)]
            out.append((trajs, [0.0 if bad else 1.0] * 2, infos))
        return out


def test_rollout_groups_replaces_a_failing_group_by_the_slots_reserve_prompt():
    c = _cfg()
    c.rl.group_size, c.rl.prompts_per_step, c.exp.steps = 2, 2, 3
    sched = runtime.PromptSchedule(c, 3, lag=0)
    reqs = sched.assign(0)
    train_ids = set(runtime.prompt_ids(c, 3 * 2))
    reserve = reqs[1]["reserve"]
    assert len(reserve) == 2 and not set(reserve) & train_ids                  # fresh: never in the epoch
    assert sched.reserve(1) == reserve and sched.reserve(2)[0] not in reserve  # fixed per slot, disjoint
    env = FlakyEnv({reqs[1]["prompt_id"], reserve[0]})
    recs, info = runtime.rollout_groups(env, reqs, lambda: (None, 0), c, ByteTokenizer(c.model.vocab_size))
    assert [r.slot for r in recs] == [0, 1]                                   # both slots still train
    assert recs[1].prompt_id == reserve[1] and recs[0].prompt_id == reqs[0]["prompt_id"]
    assert env.calls == [[reqs[0]["prompt_id"], reqs[1]["prompt_id"]], [reserve[0]], [reserve[1]]]
    assert not any(i["infra"] for r in recs for i in r.infos)
    assert info["infra/replaced_groups"] == 2 and info["infra/infra_episodes"] == 4
    assert sum(r.infra["sandboxes_replaced"] for r in recs) == 4
    sched.feed(0, recs)                        # the reserve prompt's stats do not enter the epoch sampler
    env = FlakyEnv({reqs[0]["prompt_id"], *reqs[0]["reserve"]})
    with pytest.raises(RuntimeError, match=r"slot 0: its group failed on infrastructure after 2 replacement"):
        runtime.rollout_groups(env, reqs, lambda: (None, 0), c, ByteTokenizer(c.model.vocab_size))


def test_eval_harness_reruns_an_episode_whose_sandbox_died():
    from horizon.eval.harness import EvalSetup, run_eval
    from horizon.sandbox import LocalSandbox

    c = _cfg()
    tok = ByteTokenizer(c.model.vocab_size)
    task = make_synthetic_task(5)
    opened = []

    class DiesOnce(LocalSandbox):
        def exec(self, cmd, timeout=None, workdir="/workspace"):
            if len(opened) == 1:                       # the first sandbox opened is dead
                raise SandboxInfraError("container died")
            return super().exec(cmd, timeout, workdir)

    def open_fn(t):
        from horizon.tasks.synthetic import reset_sandbox
        sb = DiesOnce.create()
        opened.append(sb)
        if len(opened) > 1:
            reset_sandbox(sb, t)
        return sb

    md = task.metadata
    call = (f"<function=set><parameter=name>{md['name']}</parameter>"
            f"<parameter=value>{md['new']}</parameter></function>")

    def policy(contexts, n):
        return [_call_turn(tok, call) for _ in contexts]

    c.agent.max_turns = 1
    c.agent.max_context_tokens = 2048   # the harness's prompt carries the tool descriptions: > make run's 240
    setup = EvalSetup(agent_cfg=c.agent, tokenizer=tok, registry_fn=lambda t: synthetic_registry(), num_passes=1,
                      max_parallel=1, backend="local", open_fn=open_fn, check_edits=False)
    recs = run_eval(policy, [task], setup)
    assert len(opened) == 2 and len(recs) == 1 and recs[0]["end_reason"] == "max_turns"
    assert recs[0]["reward"] == 1.0                    # scored on the healthy sandbox, once
    setup.infra_retries = 0
    opened.clear()
    with pytest.raises(RuntimeError, match="its sandbox failed 1 times"):
        run_eval(policy, [task], setup)


def _kill_container(box):
    box.container.kill()


def _kill_executor(box):
    """SIGKILL the box's in-box executor from outside (the container stays up)."""
    box.container.exec_run(["kill", "-9", str(box._inbox.pid)], user="0:0")


class KillingEnv:
    """Delegates to an `ExperimentEnv`; in each step's first generation batch, right after the
    policy's first call (episodes are mid-flight), `docker kill`s one random container in use
    (`kill`: or kills its in-box executor)."""

    def __init__(self, env, rng, kill=_kill_container):
        self.env, self.rng, self.kills, self.killed_ids, self.steps_hit = env, rng, 0, set(), set()
        self.kill = kill

    @property
    def counters(self):
        return self.env.counters

    def rollouts(self, requests, policy, tok):
        step = requests[0]["slot"] // 2
        if step in self.steps_hit or "replaces" in requests[0]:
            return self.env.rollouts(requests, policy, tok)
        self.steps_hit.add(step)
        n_used = len(requests) * 2
        fired = []

        def wrapped(contexts, limit):
            out = policy(contexts, limit)
            if not fired:
                fired.append(1)
                box = self.env.pool.boxes[int(self.rng.integers(n_used))]
                t = threading.Thread(target=self.kill, args=(box,))
                t.start()
                t.join()
                self.kills += 1
                self.killed_ids.add(box.container.id)
            return out

        return self.env.rollouts(requests, wrapped, tok)

    def close(self):
        self.env.close()


@pytest.mark.docker
@pytest.mark.parametrize("kill", [_kill_container, _kill_executor], ids=["container", "executor"])
def test_rl_survives_a_container_killed_every_step(tmp_path, kill):
    from horizon.model import transformer
    from horizon.rl.runtime import loop, storage, workers
    from horizon.sandbox import docker_available
    from horizon.utils.seeds import run_keys

    if not docker_available():
        pytest.skip("\n\n*** DOCKER ENGINE NOT AVAILABLE: the container-kill RL test was SKIPPED ***\n")
    c = _cfg()
    c.exp.steps, c.rl.group_size, c.rl.prompts_per_step, c.exp.pool_size = 4, 2, 2, 4
    c.agent.max_new_tokens, c.agent.num_tool_workers = 24, 4
    c.rl.sampler.update(dict(min_batch_bucket=4, min_prompt_bucket=128, min_new_bucket=32))
    c.rl.batch.update(dict(min_rows=4, min_seq=256))
    c.rl.optim.warmup_steps = 0
    c.exp.sandbox_disk_mb = 0
    tok = ByteTokenizer(c.model.vocab_size)
    params = transformer.init(run_keys(c.seed)["init"], c.model)
    env = KillingEnv(workers.family_env(c), np.random.default_rng(0), kill)
    store = storage.GroupStore(tmp_path / "groups")
    recs = []
    try:
        loop.run_rl(params, env, c, tok, tmp_path, recs.append, store=store)
    finally:
        env.close()
    rl = [r for r in recs if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3, 4] and env.kills == 4
    assert all(r["groups"] == 2 for r in rl)                      # prompts_per_step groups every step
    assert sum(r["infra/sandboxes_replaced"] for r in rl) == env.kills
    assert sum(r["infra/infra_episodes"] for r in rl) == env.kills   # each kill hit one live episode
    groups = [store.get(s) for s in range(8)]
    assert all(not i["infra"] for g in groups for i in g.infos)   # no killed episode was trained on
    assert all(t.end_reason != "infra" for g in groups for t in g.trajectories)


@pytest.mark.docker
def test_a_write_past_the_disk_budget_ends_the_episode_as_a_resource_failure():
    """The policy's own `dd` past the sandbox's 64 MiB budget: the episode ends "resource" (the
    policy's outcome, trained at reward 0), not "infra", and the box is usable after `prepare()`."""
    from horizon.sandbox import docker_available, open_sandbox
    from horizon.tools.builtin import make_registry

    if not docker_available():
        pytest.skip("\n\n*** DOCKER ENGINE NOT AVAILABLE: the disk-budget episode test was SKIPPED ***\n")
    c = _cfg()
    tok = ByteTokenizer(c.model.vocab_size)
    task = make_synthetic_task(1)
    with open_sandbox("docker", "horizon-sandbox:base", disk_limit_mb=64) as sb:
        ep = Episode(task, sb, make_registry(["run_shell"]), tok, c.agent)
        ep.step(_call_turn(tok, "<function=run_shell><parameter=command>dd if=/dev/zero of=/workspace/big bs=1M "
                                "count=200 2>&1; echo done</parameter></function>"))
        tr = ep.trajectory()
        assert tr.end_reason == "resource" and not tr.infra and "disk budget" in tr.failure
        sb.prepare()
        sb.exec("rm -f /workspace/big")
        assert sb.exec("echo ok").output.strip() == "ok"
