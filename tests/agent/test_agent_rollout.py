"""Agent loop: end conditions, loss-mask alignment, stats, context strategies (docs/SPEC.md §5, §6)."""

import dataclasses

import numpy as np
import pytest

from horizon.agent import Episode, Generation, ScriptedPolicy, rollout, run_episodes, split_turns, validate_agent_config
from horizon.data.tokenizer import ByteTokenizer
from horizon.sandbox.factory import open_sandbox
from horizon.tools import make_registry, render_call, render_final
from horizon.utils.config import load_config_file

TOK = ByteTokenizer()


@dataclasses.dataclass(frozen=True)
class T:
    """Duck-typed stand-in for horizon.tasks.Task (only the fields the agent reads)."""
    id: str
    prompt: str
    files: dict
    solution: tuple = ()
    final_answer: str = ""
    kind: str = "bugfix"
    metadata: dict = dataclasses.field(default_factory=dict)


def cfg(**kw):
    c = load_config_file("configs/agent_tiny.py").agent
    c.num_tool_workers = 1
    for k, v in kw.items():
        c[k] = v
    return c


def local(task):
    sb = open_sandbox("local")
    for p, text in task.files.items():
        sb.write_file(f"/workspace/{p}", text)
    return sb


TASK = T("demo", "Make add() add.", {"calc.py": "def add(a, b):\n    return a - b\n"}, solution=(
    {"name": "todo_write", "args": {"todos": [{"content": "fix add", "status": "in_progress"},
                                              {"content": "run tests", "status": "pending"}]}},
    {"name": "read_file", "args": {"path": "/workspace/calc.py"}},
    {"name": "edit_file", "args": {"command": "str_replace", "path": "/workspace/calc.py",
                                   "old_str": "a - b", "new_str": "a + b"}},
    {"name": "run_shell", "args": {"command": "python3 -c 'import calc; print(calc.add(2, 3))'"}},
    {"name": "todo_write", "args": {"todos": [{"content": "fix add", "status": "completed"},
                                              {"content": "run tests", "status": "pending"}]}},
), final_answer="Fixed the sign in add().")


class Recorder:
    """Wraps a policy; gives each generation distinct nonzero logprobs, per-token versions and router ids."""

    def __init__(self, inner, L=2, k=2):
        self.inner, self.L, self.k, self.gens, self.contexts = inner, L, k, [], []

    def __call__(self, contexts, max_new_tokens):
        out = []
        for g in self.inner(contexts, max_new_tokens):
            m = len(g.tokens)
            n = len(self.gens)
            lp = -np.arange(1, m + 1, dtype=np.float32) / 100 - n
            ri = (np.arange(self.L * m * self.k, dtype=np.int32).reshape(self.L, m, self.k) + n) % 7
            out.append(Generation(g.tokens, lp, ri, np.full(m, n, np.int32)))
        self.gens += out
        self.contexts += [np.asarray(c) for c in contexts]
        return out


def test_scripted_episode_solves_and_counts_stats():
    sb = local(TASK)
    try:
        traj = rollout(ScriptedPolicy.from_tasks([TASK], TOK), TASK, sb, cfg())
        assert traj.end_reason == "final" and traj.final_answer == TASK.final_answer
        assert sb.read_file("/workspace/calc.py") == b"def add(a, b):\n    return a + b\n"
    finally:
        sb.close()
    s = traj.stats
    assert (s["tool_calls"], s["turns"], s["summaries"], s["malformed_calls"]) == (5, 6, 0, 0)
    assert (s["todos_created"], s["todos_completed"]) == (2, 1)
    # every generated token is in exactly one category; here each turn has a `<think>[step k]</think>` block
    assert s["thinking_tokens"] == sum(len(f"<think>[step {k}]</think>") for k in range(6))
    assert s["final_tokens"] == len(render_final(TASK.final_answer)) + 2   # "\n" after </think> + END_TURN
    total = s["thinking_tokens"] + s["tool_call_tokens"] + s["final_tokens"]
    assert total == traj.num_generated_tokens
    obs = [t for r, t in split_turns(traj.segments[0].tokens, TOK) if r == "observation"]
    assert s["tool_output_tokens"] == sum(len(TOK.encode(o)) for o in obs)
    assert "5\n[exit code: 0]" in obs[3]


def test_an_episode_parses_the_configured_tool_format():
    """agent.tool_format = "hermes": the system prompt teaches JSON calls and the episode executes them."""
    from horizon.tools.format import tool_format

    fmt = tool_format("hermes")
    script = [fmt.render_call(c["name"], c["args"]) for c in TASK.solution] + [fmt.render_final(TASK.final_answer)]
    sb = local(TASK)
    try:
        traj = rollout(ScriptedPolicy({TASK.prompt: script}, TOK), TASK, sb, cfg(tool_format="hermes"))
        assert traj.end_reason == "final" and traj.stats["malformed_calls"] == 0
        assert sb.read_file("/workspace/calc.py") == b"def add(a, b):\n    return a + b\n"
    finally:
        sb.close()
    system = split_turns(traj.segments[0].tokens, TOK)[0][1]
    assert "<tool_call>" in system and "<function=NAME>" not in system
    with pytest.raises(ValueError, match="agent.tool_format='json'"):
        validate_agent_config(cfg(tool_format="json"))


def test_loss_mask_logprobs_versions_router_alignment():
    sb = local(TASK)
    rec = Recorder(ScriptedPolicy.from_tasks([TASK], TOK))
    try:
        traj = rollout(rec, TASK, sb, cfg())
    finally:
        sb.close()
    (seg,) = traj.segments
    n = len(seg.tokens)
    assert seg.loss_mask.shape == seg.logprobs.shape == seg.policy_versions.shape == (n,)
    assert seg.router_indices.shape == (2, n, 2)
    gen_tokens = np.concatenate([g.tokens for g in rec.gens])
    np.testing.assert_array_equal(seg.tokens[seg.loss_mask], gen_tokens)
    np.testing.assert_array_equal(seg.logprobs[seg.loss_mask], np.concatenate([g.logprobs for g in rec.gens]))
    assert np.all(seg.logprobs[~seg.loss_mask] == 0) and np.all(seg.policy_versions[~seg.loss_mask] == -1)
    np.testing.assert_array_equal(seg.policy_versions[seg.loss_mask], np.concatenate([g.versions() for g in rec.gens]))
    np.testing.assert_array_equal(seg.router_indices[:, seg.loss_mask],
                                  np.concatenate([g.router_indices for g in rec.gens], axis=1))
    assert np.all(seg.router_indices[:, ~seg.loss_mask] == -1)
    # each context the policy saw is a prefix of the final segment, ending with a bare ASSISTANT
    for c in rec.contexts:
        assert c[-1] == TOK.ASSISTANT
        np.testing.assert_array_equal(seg.tokens[:len(c)], c)
    # the model's END_TURN is generated (masked in); role tokens are not
    assert seg.tokens[seg.loss_mask][-1] == TOK.END_TURN
    assert not seg.loss_mask[seg.tokens == TOK.ASSISTANT].any()


class Const:
    def __init__(self, text, stop=True):
        self.text, self.stop = text, stop

    def __call__(self, contexts, max_new_tokens):
        ids = TOK.encode(self.text) + ([TOK.END_TURN] if self.stop else [])
        ids = np.asarray(ids, np.int32)[:max_new_tokens]
        return [Generation(ids, np.zeros(len(ids), np.float32)) for _ in contexts]


LIST = render_call("list_dir", {"path": "/workspace"})


@pytest.mark.parametrize("policy,overrides,reason", [
    (Const(render_final("ok")), {}, "final"),
    (Const(LIST), {"max_turns": 3}, "max_turns"),
    (Const(LIST), {"max_total_tokens": 200}, "token_budget"),
    (Const("no idea what to do"), {"max_malformed_calls": 2}, "malformed"),
    (Const(LIST), {"context_strategy": "none", "max_context_tokens": 3000, "trigger_tokens": 2000,
                   "max_new_tokens": 100}, "context_full"),
])
def test_episode_end_conditions(policy, overrides, reason):
    sb = local(TASK)
    try:
        traj = rollout(policy, TASK, sb, cfg(**overrides))
    finally:
        sb.close()
    assert traj.end_reason == reason
    if reason == "max_turns":
        assert traj.stats["turns"] == 3 and traj.stats["tool_calls"] == 3
    if reason == "malformed":
        assert traj.stats["malformed_calls"] == 2 and traj.stats["tool_calls"] == 0
        obs = [t for r, t in split_turns(traj.segments[0].tokens, TOK) if r == "observation"]
        assert obs[0].startswith("Your action could not be parsed: no tool call")
    if reason == "token_budget":
        assert 200 <= traj.num_generated_tokens < 200 + len(LIST) + 1


def test_first_prompt_filling_the_context_ends_without_a_policy_call():
    """A task prompt already at `max_context_tokens` (a task set's prompt longer than the model's
    context): the episode ends "context_full" before any turn; the policy (the engine refuses
    max_new 0) is never called."""
    calls = []

    def policy(contexts, max_new_tokens):
        calls.append(max_new_tokens)
        raise AssertionError("no room: the policy must not be called")

    sb = local(TASK)
    try:
        ep = Episode(TASK, sb, make_registry(), TOK, cfg(context_strategy="none", max_context_tokens=40,
                                                         trigger_tokens=30, max_new_tokens=10))
        (traj,) = run_episodes(policy, [ep], max_steps=2)
    finally:
        sb.close()
    assert traj.end_reason == "context_full" and not calls and traj.num_generated_tokens == 0


def test_truncated_generation_gets_harness_end_turn_and_max_steps():
    sb = local(TASK)
    try:
        ep = Episode(TASK, sb, make_registry(), TOK, cfg(max_new_tokens=10))
        (traj,) = run_episodes(Const(LIST, stop=False), [ep], max_steps=2)
    finally:
        sb.close()
    assert traj.end_reason == "max_steps" and traj.stats["malformed_calls"] == 2
    seg = traj.segments[0]
    gen_idx = np.nonzero(seg.loss_mask)[0]
    assert len(gen_idx) == 20 and seg.tokens[gen_idx[9] + 1] == TOK.END_TURN and not seg.loss_mask[gen_idx[9] + 1]


def test_run_episodes_batches_many_episodes():
    tasks = [dataclasses.replace(TASK, id=f"d{i}") for i in range(3)]
    sbs = [local(t) for t in tasks]
    calls = []

    class Batched(ScriptedPolicy):
        def __call__(self, contexts, max_new_tokens):
            calls.append(len(contexts))
            return super().__call__(contexts, max_new_tokens)

    try:
        eps = [Episode(t, s, make_registry(), TOK, cfg(num_tool_workers=3)) for t, s in zip(tasks, sbs)]
        trajs = run_episodes(Batched.from_tasks([TASK], TOK), eps, max_steps=20, num_tool_workers=3)
        assert all(t.end_reason == "final" for t in trajs) and calls == [3] * 6
        assert all(s.read_file("/workspace/calc.py").endswith(b"a + b\n") for s in sbs)
    finally:
        for s in sbs:
            s.close()


def test_config_validation():
    with pytest.raises(ValueError, match="context_strategy"):
        validate_agent_config(cfg(context_strategy="magic"))
    with pytest.raises(ValueError, match="trigger_tokens"):
        validate_agent_config(cfg(trigger_tokens=10**6))


def test_step_alone_executes_the_tool_call():
    sb = local(TASK)
    try:
        ep = Episode(TASK, sb, make_registry(), TOK, cfg())
        pol = ScriptedPolicy.from_tasks([TASK], TOK)
        while not ep.done:
            ep.step(pol([ep.context_tokens()], ep.max_new_tokens())[0])
        assert ep.trajectory().end_reason == "final" and sb.read_file("/workspace/calc.py").endswith(b"a + b\n")
    finally:
        sb.close()
