"""The synthetic config-edit task family used by the RL demo (horizon.tasks.synthetic, docs/SPEC.md §4, §7)."""

import pytest

from horizon.sandbox import open_sandbox
from horizon.tasks import synthetic as syn
from horizon.tasks import verify
from horizon.tools.format import parse_action, render_call
from horizon.tools.registry import ToolContext, ToolState


def _apply(sandbox, call, tool="set"):
    return syn.synthetic_registry(tool=tool).execute(call["name"], call["args"], ToolContext(sandbox, ToolState()))


def test_deterministic_and_varied():
    a, b = syn.make_synthetic_task(7), syn.make_synthetic_task(7)
    assert a == b
    assert syn.synthetic_task_from_id("synth_7") == a
    prompts = {syn.make_synthetic_task(s).prompt for s in range(200)}
    assert len(prompts) >= 195          # values/names/modules vary: near-unique prompts (collisions are rare)
    for s in range(50):
        t = syn.make_synthetic_task(s)
        md = t.metadata
        assert md["old"] != md["new"] and t.prompt == f"In {md['module']}.py set {md['name']} to {md['new']}."
        assert t.files[f"{md['module']}.py"].count(f"{md['name']} = {md['old']}\n") == 1
        assert t.solution[0] == {"name": "set", "args": {"value": str(md["new"]), "name": md["name"]}}
        # the canonical call round-trips through the agent's parser (what SFT demos teach)
        act = parse_action(render_call("set", t.solution[0]["args"]))
        assert act.kind == "call" and act.name == "set" and act.args == t.solution[0]["args"]


def test_splits_disjoint():
    train = syn.synthetic_seeds("train", 100)
    held = syn.synthetic_seeds("heldout", 100)
    assert not set(train) & set(held)
    assert all(syn.make_synthetic_task(s).split == "train" for s in train[:5])
    assert all(syn.make_synthetic_task(s).split == "heldout" for s in held[:5])
    with pytest.raises(ValueError):
        syn.synthetic_seeds("train", 10, start=syn.HELDOUT_SEED_START - 5)
    with pytest.raises(ValueError):
        syn.make_synthetic_task(-1)


def _check_solution_passes_and_initial_fails(sb, seeds):
    for s in seeds:
        t = syn.make_synthetic_task(s)
        md = t.metadata
        syn.reset_sandbox(sb, t)
        assert verify(t, sb).reward == 0.0, "the initial state must fail"
        wrong = md["old"] + 1 if md["old"] + 1 != md["new"] else md["old"] + 2
        res = _apply(sb, {"name": "set", "args": {"name": md["name"], "value": str(wrong)}})
        assert not res.error and f"{md['name']} = {wrong}" in res.output, res.output
        assert verify(t, sb).reward == 0.0, "a wrong value must fail"
        res = _apply(sb, {"name": "set", "args": {"name": "NOT_THERE", "value": "3"}})
        assert res.error and "NOT_THERE" in res.output
        res = _apply(sb, {"name": "set", "args": {"name": md["name"], "value": "1; rm -rf /"}})
        assert res.error and "integer" in res.output          # values are validated before any exec
        syn.reset_sandbox(sb, t)                 # the reset really restores the initial file
        res = _apply(sb, t.solution[0])
        assert not res.error, res.output
        assert verify(t, sb).reward == 1.0
        syn.reset_sandbox(sb, t)                 # the edit_file variant solves the same task
        res = _apply(sb, syn.edit_solution(t), tool="edit_file")
        assert not res.error, res.output
        assert verify(t, sb).reward == 1.0


def test_solution_passes_local():
    sb = open_sandbox("local")
    try:
        _check_solution_passes_and_initial_fails(sb, [0, 1, syn.HELDOUT_SEED_START + 3])
    finally:
        sb.close()


@pytest.mark.docker
def test_solution_passes_docker(docker_ready, docker_limits):
    sb = open_sandbox("docker", docker_ready, **docker_limits)
    try:
        _check_solution_passes_and_initial_fails(sb, [2, syn.HELDOUT_SEED_START + 4])
    finally:
        sb.close()


def test_registries():
    from horizon.tools.builtin import BUILTIN_TOOLS
    reg = syn.synthetic_registry()
    assert reg.names == ["set"] and reg.tools["set"].fn is syn.set_constant
    # strict schema: unknown / missing arguments are rejected before the tool runs
    assert reg.execute("set", {"name": "A", "value": "1", "path": "/x"}, ToolContext(None, ToolState())).error
    assert reg.execute("set", {"name": "A"}, ToolContext(None, ToolState())).error
    assert reg.execute("set", {"name": "lower", "value": "1"}, ToolContext(None, ToolState())).error
    ed = syn.synthetic_registry(tool="edit_file")
    assert ed.names == ["edit_file"] and ed.tools["edit_file"].fn is BUILTIN_TOOLS["edit_file"].fn
    # a call that is not str_replace is rejected by the schema (strict registry)
    assert ed.execute("edit_file", {"command": "create", "path": "/workspace/x", "file_text": "1"},
                      ToolContext(None, ToolState())).error
    with pytest.raises(ValueError):
        syn.synthetic_registry(tool="nope")
