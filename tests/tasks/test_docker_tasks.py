"""Tasks in real containers from the built task images (docs/SPEC.md §5). Marked `docker`.

Builds the images of a few tasks with envs/build_task_images.py (skipped when current),
then checks: the task image is used, the initial state fails, the solution passes; the
base-image fallback writes files owned by the sandbox user; a recall task's many files
arrive intact; the builder is idempotent and detects stale images.
"""

import dataclasses
import importlib.util
import pathlib

import pytest

from horizon.tasks import get_task, make_recall_task, open_task_sandbox, task_image_state, verify

pytestmark = pytest.mark.docker
REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKER_TASKS = ["fix_leap_year", "add_stack_peek", "config_add_dependency", "question_default_port"]


@pytest.fixture(scope="module")
def builder(docker_ready):
    spec = importlib.util.spec_from_file_location("build_task_images", REPO / "envs" / "build_task_images.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import docker

    client = docker.from_env(timeout=300)
    for tid in DOCKER_TASKS:
        mod.build_task_image(client, get_task(tid), docker_ready)
    return mod, client


@pytest.mark.parametrize("task_id", DOCKER_TASKS)
def test_task_in_container(builder, task_id, solve, docker_limits):
    task = get_task(task_id)
    with open_task_sandbox(task, backend="docker", **docker_limits) as sb:
        assert sb.task_source == "image" and sb.image == task.image
        assert verify(task, sb).reward < 1.0
        solve(task, sb)
        res = verify(task, sb, final_answer=task.final_answer)
        assert res.reward == 1.0, res.output


def test_builder_idempotent_and_stale(builder, docker_ready):
    mod, client = builder
    task = get_task(DOCKER_TASKS[0])
    assert mod.build_task_image(client, task, docker_ready) == "skipped"
    changed = dataclasses.replace(task, files={**task.files, "calendar_utils.py": "# changed\n"})
    assert task_image_state(changed, client, docker_ready) == "stale"
    assert task_image_state(dataclasses.replace(task, image="horizon-task:does-not-exist"), client,
                            docker_ready) == "missing"
    labels = client.images.get(task.image).labels
    assert labels["horizon.sandbox.task_id"] == task.id


def test_base_image_fallback_and_recall(docker_ready, solve, docker_limits):
    task = get_task("fix_empty_mean")
    with open_task_sandbox(task, backend="docker", use_task_image=False, **docker_limits) as sb:
        assert sb.task_source == "files"
        r = sb.exec("stat -c '%u %n' stats.py tests tests/test_stats.py; ls -A")
        assert r.ok and r.output.split()[:6:2] == ["1000"] * 3, r.output
        assert ".horizon_task_files.tar" not in r.output
        solve(task, sb)
        assert verify(task, sb).reward == 1.0
    recall = make_recall_task(5, n_filler_files=20, filler_bytes=2048)
    with open_task_sandbox(recall, backend="docker", **docker_limits) as sb:
        assert sb.task_source == "files"
        for path in (recall.metadata["filler_files"][0], recall.metadata["filler_files"][-1], "notes/KEY.txt"):
            assert sb.read_file(f"/workspace/{path}").decode() == recall.files[path]
        solve(recall, sb)
        assert verify(recall, sb, final_answer=recall.final_answer).reward == 1.0
