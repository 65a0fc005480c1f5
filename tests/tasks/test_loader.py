"""Task loading and validation errors (docs/SPEC.md §5)."""

import json

import pytest

from horizon.tasks import Task, TaskError, get_task, load_task_dir, load_tasks

GOOD = {"id": "demo_task", "prompt": "fix it", "test_cmd": "python3 -m pytest -q tests", "kind": "bugfix",
        "split": "train", "reward_mode": "binary", "should_edit": True, "final_answer": "", "metadata": {}}


def write_task(root, meta=None, files=None, solution=None, name=None):
    meta = dict(GOOD if meta is None else meta)
    d = root / (name or meta.get("id", "demo_task"))
    (d / "files" / "tests").mkdir(parents=True)
    for rel, text in (files or {"a.py": "X = 1\n", "tests/test_a.py": "def test_a():\n    pass\n"}).items():
        (d / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "files" / rel).write_text(text)
    (d / "task.json").write_text(json.dumps(meta))
    if solution is not None:
        (d / "solution.json").write_text(json.dumps(solution))
    return d


def test_load_good_task(tmp_path):
    d = write_task(tmp_path, solution=[{"name": "read_file", "args": {"path": "/workspace/a.py"}}])
    (d / "files" / "__pycache__").mkdir()
    (d / "files" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    t = load_task_dir(d)
    assert t.files == {"a.py": "X = 1\n", "tests/test_a.py": "def test_a():\n    pass\n"}
    assert t.solution == ({"name": "read_file", "args": {"path": "/workspace/a.py"}},)
    assert t.image == "horizon-task:demo_task"
    assert [x.id for x in load_tasks(tmp_path)] == ["demo_task"]
    assert load_tasks(tmp_path, split="heldout") == []
    assert get_task("demo_task", root=tmp_path).id == "demo_task"


@pytest.mark.parametrize("change,message", [
    ({"prompt": None}, "missing required field"),
    ({"reward_mode": "vibes"}, "reward_mode 'vibes'"),
    ({"kind": "poetry"}, "kind 'poetry'"),
    ({"split": "test"}, "split 'test'"),
    ({"id": "other_name"}, "differs from its directory"),
    ({"colour": "red"}, "unknown field"),
    ({"test_cmd": ""}, "test_cmd is required"),
    ({"should_edit": False}, 'reward_mode must be "answer"'),
    ({"reward_mode": "answer", "test_cmd": ""}, 'metadata["expected"]'),
])
def test_validation_errors(tmp_path, change, message):
    meta = {**GOOD, **change}
    if change.get("prompt", 1) is None:
        del meta["prompt"]
    d = write_task(tmp_path, meta, name="demo_task")
    with pytest.raises(TaskError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_task_dir(d)


def test_bad_files_and_json(tmp_path):
    d = write_task(tmp_path)
    (d / "task.json").write_text("{not json")
    with pytest.raises(TaskError, match="invalid JSON"):
        load_task_dir(d)
    with pytest.raises(TaskError, match="escapes /workspace"):
        Task(id="x", prompt="p", files={"../etc/passwd": ""}, test_cmd="true")
    with pytest.raises(TaskError, match="relative to /workspace"):
        Task(id="x", prompt="p", files={"/abs.py": ""}, test_cmd="true")
    with pytest.raises(TaskError, match="task id"):
        Task(id="Bad Id", prompt="p", files={}, test_cmd="true")
    with pytest.raises(TaskError, match="solution"):
        Task(id="x", prompt="p", files={}, test_cmd="true", solution=({"tool": "read_file"},))
    with pytest.raises(TaskError, match="missing task.json"):
        load_task_dir(tmp_path)


def test_get_task_unknown_and_split_check(tmp_path):
    write_task(tmp_path)
    with pytest.raises(KeyError, match="known: \\['demo_task'\\]"):
        get_task("nope", root=tmp_path)
    with pytest.raises(TaskError, match="split"):
        load_tasks(tmp_path, split="validation")
    assert get_task("recall_7").kind == "recall"
