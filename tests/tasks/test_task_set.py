"""The in-repo task set loads, validates, and each scripted solution really solves its task.

For every task (LocalSandbox backend, for speed): the initial files must FAIL verification
(reward < 1, and 0 for binary/answer tasks) and the files after replaying solution.json
through the tools must PASS (reward 1). docs/SPEC.md §5, §7.
"""

import collections

import pytest

from horizon.tasks import KINDS, load_tasks, open_task_sandbox, verify
from horizon.tasks.loader import default_root

TASKS = load_tasks()
MIN_TASKS = 24
HELDOUT_RANGE = (0.15, 0.35)   # "~25% heldout"


def test_task_set_shape():
    assert len(TASKS) >= MIN_TASKS
    ids = [t.id for t in TASKS]
    assert len(set(ids)) == len(ids)
    frac = sum(t.split == "heldout" for t in TASKS) / len(TASKS)
    assert HELDOUT_RANGE[0] <= frac <= HELDOUT_RANGE[1], frac
    kinds = collections.Counter(t.kind for t in TASKS)
    assert {"bugfix", "feature", "tests", "config", "question"} <= set(kinds)
    assert set(kinds) <= set(KINDS)
    questions = [t for t in TASKS if t.kind == "question"]
    assert len(questions) >= 2 and all(not t.should_edit and t.reward_mode == "answer" for t in questions)
    one_edit = [t for t in TASKS if t.metadata.get("edits") == 1]
    assert len(one_edit) >= 5, "several tasks must be solvable with one small edit"


def test_split_filter():
    train, held = load_tasks(split="train"), load_tasks(split="heldout")
    assert {t.id for t in train} | {t.id for t in held} == {t.id for t in TASKS}
    assert not {t.id for t in train} & {t.id for t in held}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_task_fails_then_solution_passes(task, solve):
    assert task.solution, "every task needs a scripted solution"
    assert task.image == f"horizon-task:{task.id}"
    assert str(default_root()) in task.metadata["source"]
    with open_task_sandbox(task, backend="local", default_timeout=60) as sb:
        before = verify(task, sb, final_answer="")
        assert before.reward < 1.0, before.output
        if task.reward_mode != "fraction":
            assert before.reward == 0.0, before.output
        else:
            assert 0 < before.passed < before.total, before.output   # some tests already pass
        solve(task, sb)
        after = verify(task, sb, final_answer=task.final_answer)
        assert after.reward == 1.0, after.output
        assert after.passed == after.total > 0


@pytest.mark.parametrize("task", [t for t in TASKS if not t.should_edit], ids=lambda t: t.id)
def test_question_tasks_penalize_edits(task, solve):
    with open_task_sandbox(task, backend="local") as sb:
        solve(task, sb)
        path = sorted(p for p in task.files if p.endswith(".py") and task.files[p])[0]
        sb.write_file(f"/workspace/{path}", task.files[path] + "\n# touched\n")
        res = verify(task, sb, final_answer=task.final_answer)
        assert res.reward == 0.0 and "edited files" in res.output
        assert verify(task, sb, final_answer=task.final_answer, check_edits=False).reward == 1.0
