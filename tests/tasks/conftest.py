"""Fixtures for the task-set tests (docs/SPEC.md §5, §7).

`run_solution(task, sandbox)` plays a task's scripted tool calls through the real tool
registry (`horizon.tools`), or through a minimal str_replace/create/insert applier when
that package cannot be imported. Local sandboxes run the host's `python3`, so the
interpreter running pytest (which has pytest installed) is put first on PATH.
"""

import os
import sys
import uuid

import pytest

TEST_LABEL = "horizon.test_run"
RUN_ID = uuid.uuid4().hex[:10]
NO_DOCKER = ("\n\n*** DOCKER ENGINE NOT AVAILABLE: task-image tests SKIPPED; the tasks were NOT checked "
             "in real containers. ***\n")


@pytest.fixture(autouse=True)
def _python_with_pytest_on_path(monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    # The sandbox image's pytest has no third-party plugins; the venv's (jaxtyping, ...) cost
    # ~1 s of startup per task run, so local runs skip them too.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def _minimal_apply(call, sandbox):
    """Edit-only applier (fallback): the str_replace editor semantics the tools implement."""
    if call["name"] != "edit_file":
        return ""
    a = call["args"]
    if a["command"] == "create":
        sandbox.write_file(a["path"], a["file_text"])
    elif a["command"] == "str_replace":
        text = sandbox.read_file(a["path"]).decode()
        assert text.count(a["old_str"]) == 1, f"old_str must occur once in {a['path']}"
        sandbox.write_file(a["path"], text.replace(a["old_str"], a["new_str"]))
    elif a["command"] == "insert":
        text = sandbox.read_file(a["path"]).decode()
        lines = text.split("\n")
        lines = lines[:-1] if text.endswith("\n") else lines
        lines[a["insert_line"]:a["insert_line"]] = a["new_str"].split("\n")
        sandbox.write_file(a["path"], "\n".join(lines) + "\n")
    else:
        raise AssertionError(f"unknown edit command {a['command']!r}")
    return "ok"


def run_solution(task, sandbox):
    """Execute `task.solution` in `sandbox`; returns the observations. Edit errors fail the test."""
    try:
        from horizon.tools import ToolContext, ToolState, make_registry
    except ImportError:
        return [_minimal_apply(c, sandbox) for c in task.solution]
    registry, ctx = make_registry(), None
    ctx = ToolContext(sandbox=sandbox, state=ToolState())
    outputs = []
    for call in task.solution:
        res = registry.execute(call["name"], call.get("args", {}), ctx)
        assert not res.error, f"{task.id}: {call['name']} failed: {res.output}"
        outputs.append(res.output)
    return outputs


@pytest.fixture
def solve():
    return run_solution


@pytest.fixture
def docker_limits():
    """Sandbox limits for docker tests: a run label so teardown removes what the run made."""
    return {"labels": {TEST_LABEL: RUN_ID}, "default_timeout": 60}


@pytest.fixture(scope="session")
def docker_ready():
    from horizon.sandbox import DEFAULT_BASE_IMAGE, docker_available

    if not docker_available():
        pytest.skip(NO_DOCKER)
    import docker

    try:
        docker.from_env().images.get(DEFAULT_BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"base image {DEFAULT_BASE_IMAGE} missing: run `make image` (envs/build_base_image.sh)")
    yield DEFAULT_BASE_IMAGE
    from horizon.sandbox.docker import cleanup_leaked

    cleanup_leaked(labels={TEST_LABEL: RUN_ID})
