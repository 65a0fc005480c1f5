"""Parallel tool calls (docs/SPEC.md §5): several calls in one turn parse, run at the same time in the
episode's sandbox (real LocalSandbox and, docker-marked, DockerSandbox), and come back in one observation
with each call's own result or error; the default of one call per turn is unchanged."""

import dataclasses
import threading

import numpy as np
import pytest

from horizon.agent import Episode, Generation, split_turns
from horizon.data.tokenizer import ByteTokenizer
from horizon.sandbox.base import SandboxInfraError
from horizon.tools import make_registry
from horizon.tools.format import ToolCall, join_results, parse_action, tool_format
from horizon.tools.registry import Param, Tool, ToolRegistry
from horizon.utils.config import ConfigError, load_config_file

TOK = ByteTokenizer()


@dataclasses.dataclass(frozen=True)
class T:
    id: str = "parallel"
    prompt: str = "Look around."
    files: dict = dataclasses.field(default_factory=dict)
    kind: str = "bugfix"
    metadata: dict = dataclasses.field(default_factory=dict)


def cfg(**kw):
    c = load_config_file("configs/agent_tiny.py").agent
    c.include_file_listing = False
    for k, v in kw.items():
        c[k] = v
    return c


def turn(text: str) -> Generation:
    ids = np.asarray(TOK.encode(text) + [TOK.END_TURN], np.int32)
    return Generation(ids, np.zeros(len(ids), np.float32))


def rendezvous(me: str, other: str) -> str:
    """A shell command that meets its partner: it marks `me`, then waits up to 20 s for `other`. Run one
    after the other, the first of two such calls prints "alone" (no timing is measured: it is the
    partner's file that says the two ran at the same time)."""
    return (f"touch {me}; for i in $(seq 200); do [ -e {other} ] && {{ echo met {me}; exit 0; }}; "
            f"sleep 0.1; done; echo alone {me}")


@pytest.mark.parametrize("name", ["horizon", "hermes"])
def test_a_turn_of_several_calls_parses_up_to_the_limit(name):
    fmt = tool_format(name)
    calls = [ToolCall("read_file", {"path": "/workspace/a.py"}), ToolCall("run_shell", {"command": "ls\n-l"})]
    text = fmt.render_calls(calls, thinking="two at once")
    act = fmt.parse_action(text, 2)
    assert act.kind == "call" and act.tool_calls() == tuple(calls) and act.thinking == "two at once"
    assert (act.name, act.args) == (calls[0].name, calls[0].args)
    # one call per turn (the default): a second call is a malformed turn, as before
    assert parse_action(tool_format("horizon").render_calls(calls)).message == "only one tool call per turn is allowed"
    assert fmt.parse_action(text, 1).message == "only one tool call per turn is allowed"
    assert "at most 2" in fmt.parse_action(fmt.render_calls(calls * 2), 2).message
    # a one-call turn parses to the same Action at any limit
    one = fmt.render_call("read_file", {"path": "/workspace/a.py"})
    assert fmt.parse_action(one, 4) == fmt.parse_action(one, 1)
    assert fmt.parse_action(one, 4).tool_calls() == (calls[0],)


def test_only_whitespace_may_separate_calls():
    fmt = tool_format("horizon")
    a, b = fmt.render_call("list_dir", {"path": "/"}), fmt.render_call("list_dir", {"path": "/tmp"})
    assert "unexpected text after </function>" in parse_action(f"{a}\nand then\n{b}", 3).message
    assert "never closed" in parse_action(f"{a}\n<function=list_dir>", 3).message
    assert parse_action(f"{a}\n\n  {b}\n", 3).tool_calls()[1].args == {"path": "/tmp"}


def test_parallel_calls_run_at_the_same_time_with_per_call_errors(sandbox):
    """Two calls that can only finish together, a missing file and an unknown tool: one observation with
    the four results in the turn's order; the counts (docs/SPEC.md §5) and the system prompt's rule."""
    sandbox.exec("rm -f pc_a pc_b")
    calls = [ToolCall("run_shell", {"command": rendezvous("pc_a", "pc_b")}),
             ToolCall("run_shell", {"command": rendezvous("pc_b", "pc_a")}),
             ToolCall("read_file", {"path": "/workspace/missing.txt"}),
             ToolCall("launch_rocket", {})]
    ep = Episode(T(), sandbox, make_registry(), TOK, cfg(max_parallel_calls=4, max_turns=2))
    ep.step(turn(tool_format().render_calls(calls)))
    assert not ep.done
    obs = ep.messages[-1]
    assert obs.role == "observation"
    heads = [f"[call {i}: {c.name}]" for i, c in enumerate(calls, 1)]
    assert [obs.text.index(h) for h in heads] == sorted(obs.text.index(h) for h in heads)
    parts = [obs.text.split(h, 1)[1] for h in heads]
    assert "met pc_a" in parts[0].split(heads[1])[0] and "met pc_b" in parts[1].split(heads[2])[0]
    assert "alone" not in obs.text
    assert "Error" in parts[2].split(heads[3])[0] and "unknown tool 'launch_rocket'" in parts[3]
    assert ep.stats["tool_calls"] == 4 and ep.stats["parallel_calls"] == 4 and ep.stats["turns"] == 1
    assert ep.stats["malformed_calls"] == 0
    assert ep.stats["tool_output_tokens"] == len(TOK.encode(obs.text))
    system = split_turns(ep.context_tokens(), TOK)[0][1]
    assert "up to 4 tool calls in one turn" in system
    ep.step(turn(tool_format().render_call("list_dir", {"path": "/workspace"})))
    assert ep.done and ep.stats["tool_calls"] == 5 and ep.stats["parallel_calls"] == 4


def test_one_call_per_turn_is_the_default():
    """The default config: no parallel rule in the prompt, a two-call turn is malformed and runs nothing."""
    ran = []
    reg = ToolRegistry([Tool("note", "records a word", (Param("word"),), lambda ctx, word: ran.append(word) or "ok")])
    ep = Episode(T(), None, reg, TOK, cfg(max_turns=3))
    assert "tool calls in one turn" not in split_turns(ep.context_tokens(), TOK)[0][1]
    ep.step(turn(tool_format().render_calls([ToolCall("note", {"word": "a"}), ToolCall("note", {"word": "b"})])))
    assert ran == [] and ep.stats["malformed_calls"] == 1 and ep.stats["tool_calls"] == 0
    assert "only one tool call per turn" in ep.messages[-1].text
    ep.step(turn(tool_format().render_call("note", {"word": "c"})))
    assert ran == ["c"] and ep.messages[-1].text == "ok" and ep.stats["parallel_calls"] == 0


def test_a_sandbox_failure_in_one_call_ends_the_episode_after_the_others_finish():
    """Infrastructure is not the policy (docs/SPEC.md §4): a call whose sandbox fails makes the episode
    "infra" (never scored), and only once its sibling calls have finished."""
    release, finished = threading.Event(), []

    def slow(ctx, word):
        release.wait(10)
        finished.append(word)
        return word

    def broken(ctx, word):
        release.set()
        raise SandboxInfraError("container died")

    reg = ToolRegistry([Tool("slow", "", (Param("word"),), slow), Tool("broken", "", (Param("word"),), broken)])
    ep = Episode(T(), None, reg, TOK, cfg(max_parallel_calls=2))
    ep.step(turn(tool_format().render_calls([ToolCall("slow", {"word": "x"}), ToolCall("broken", {"word": "y"})])))
    assert ep.done and ep.end_reason == "infra" and "container died" in ep.failure
    assert finished == ["x"]


def test_join_results_and_config_check():
    calls = [ToolCall("a"), ToolCall("b")]
    assert join_results(calls[:1], ["out"]) == "out"
    assert join_results(calls, ["1", "2"]) == "[call 1: a]\n1\n[call 2: b]\n2"
    with pytest.raises(ConfigError, match="agent.max_parallel_calls=0"):
        Episode(T(), None, make_registry(), TOK, cfg(max_parallel_calls=0))
