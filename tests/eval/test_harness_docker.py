"""The harness end to end in real Docker sandboxes with scripted policies (docs/SPEC.md §7)."""

import numpy as np
import pytest

from horizon.agent import Generation, ScriptedPolicy
from horizon.data.tokenizer import ByteTokenizer
from horizon.eval import EvalSetup, run_eval, summarize
from horizon.sandbox.factory import docker_available
from horizon.tools.builtin import registry_for
from horizon.tools.format import render_call, render_final
from horizon.utils.config import load_config_file


def _tasks():
    from horizon.tasks import get_task
    from horizon.tasks.synthetic import make_synthetic_tasks
    return make_synthetic_tasks("heldout", 2) + [get_task("question_default_port")]


def _setup(passes):
    from horizon.tasks.synthetic import synthetic_registry
    cfg = load_config_file("configs/agent_tiny.py").agent   # multi-turn (eval_tiny allows one call)
    syn = synthetic_registry()
    reg = lambda t: syn if t.id.startswith("synth_") else registry_for(cfg, t.kind)  # noqa: E731
    return EvalSetup(agent_cfg=cfg, tokenizer=ByteTokenizer(), registry_fn=reg, num_passes=passes, max_parallel=6,
                     backend="docker", verify_timeout_s=60.0, active_params=1000)


class Garbage:
    """An 'untrained' policy: unparsable text every turn."""

    def __call__(self, contexts, max_new_tokens):
        ids = np.asarray(ByteTokenizer().encode("zq#@ no call here") + [ByteTokenizer.END_TURN], np.int32)
        return [Generation(ids, np.zeros(len(ids), np.float32)) for _ in contexts]


@pytest.mark.docker
def test_harness_scripted_vs_garbage_in_docker():
    if not docker_available():
        pytest.skip("NO DOCKER ENGINE ANSWERS: docker-marked harness test skipped")
    tasks, tok = _tasks(), ByteTokenizer()
    q = tasks[2]
    assert not q.should_edit
    # scripted solutions, except the question task where it also writes a file first (eager edit)
    scripts = {t.prompt: [render_call(c["name"], c["args"]) for c in t.solution] + [render_final(t.final_answer)]
               for t in tasks[:2]}
    scripts[q.prompt] = [render_call("run_shell", {"command": "echo note > /workspace/NOTES.txt"})] + \
        [render_call(c["name"], c["args"]) for c in q.solution] + [render_final(q.final_answer)]
    good = run_eval(ScriptedPolicy(scripts, tok), tasks, _setup(2), policy_name="scripted")
    bad = run_eval(Garbage(), tasks[:2], _setup(1), policy_name="garbage")

    rows, o = summarize(good)
    by = {r["task_id"]: r for r in rows}
    assert len(good) == 6 and o["n"] == 2
    for t in tasks[:2]:      # the one-call edits verify in the container
        assert by[t.id]["accuracy"] == 1.0 and by[t.id]["best_of_2"] == 1.0 and by[t.id]["tool_calls"] == 1
    assert by[q.id]["accuracy"] == 0.0          # the verifier zeroes an edited no-edit task ...
    assert o["eager_edit_rate"] == 1.0 and o["no_edit_episodes"] == 2   # ... and behaviour.eager_edit sees it
    assert all(r["edited_files"] == ["NOTES.txt"] for r in good if r["task_id"] == q.id)
    assert o["accuracy"] == pytest.approx(2 / 3) and o["malformed_call_rate"] == 0.0
    assert all(r["completion_tokens"] > 0 and r["latency_s"] >= 0 and r["flops"] == 2000.0 * r["processed_tokens"]
               for r in good)

    _, ob = summarize(bad)
    assert ob["accuracy"] == 0.0 and ob["best_of_1"] == 0.0
    assert ob["malformed_call_rate"] == 1.0 and all(r["end_reason"] == "malformed" for r in bad)
