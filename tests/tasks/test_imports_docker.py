"""Imported tasks in real containers (docs/SPEC.md §5, §7). Marked `docker`.

A SWE-bench-format instance over a small git repository written here (from the repository's
files and from a prepared image) and a Harbor directory written here are imported, run and
graded: gold 1.0, no-op 0.0, a patch fixing FAIL_TO_PASS but breaking PASS_TO_PASS 0.0, editing
the tests instead of the code 0.0; Harbor oracle 1.0, no-op 0.0; a sandbox that dies during
grading is an infra error, not a score.
"""

import json
import subprocess
import uuid

import pytest

from horizon.tasks import harbor, open_task_sandbox, swebench, verify

pytestmark = pytest.mark.docker
RUN_ID = uuid.uuid4().hex[:8]

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = "from calc import add, mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n"
NEW_TEST = "\n\ndef test_add():\n    assert add(2, 3) == 5, 'add(2, 3) should be 5'\n"


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def _diff_of(repo, edits):
    """The unified diff (git format) of `edits` {path: new content} over HEAD; the tree is reset after."""
    for path, text in edits.items():
        (repo / path).write_text(text)
    out = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    return out


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    repo = tmp_path_factory.mktemp("calc")
    (repo / "tests").mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    fixed = CALC.replace("a - b", "a + b")
    patches = {
        "gold": _diff_of(repo, {"calc.py": fixed}),
        "breaks_p2p": _diff_of(repo, {"calc.py": fixed.replace("a * b", "a * b + 1")}),
        "edits_tests": _diff_of(repo, {"tests/test_calc.py": TESTS + "\n\ndef test_add():\n    pass\n"}),
    }
    row = {"instance_id": f"local__calc-{RUN_ID}", "repo": "local/calc", "base_commit": base,
           "patch": patches["gold"], "test_patch": _diff_of(repo, {"tests/test_calc.py": TESTS + NEW_TEST}),
           "problem_statement": "calc.add returns the wrong result.",
           "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
           "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mul"])}
    path = tmp_path_factory.mktemp("set") / "instances.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return repo, path, patches


def _grade_patch(task, patch, limits):
    with open_task_sandbox(task, backend="docker", **limits) as sb:
        if patch:
            r = swebench.apply_patch(sb, patch)
            assert r.ok, r.output
        return verify(task, sb)


@pytest.mark.parametrize("case, want", [("gold", 1.0), (None, 0.0), ("breaks_p2p", 0.0), ("edits_tests", 0.0)])
def test_swebench_from_local_repo(docker_ready, docker_limits, instance, case, want):
    repo, path, patches = instance
    [task] = swebench.load_swebench(path, repo_paths={"local/calc": str(repo)})
    assert task.files["calc.py"] == CALC and task.reward_mode == "swebench"
    res = _grade_patch(task, patches.get(case), docker_limits)
    assert not res.infra and res.reward == want, res.output
    if case == "breaks_p2p":
        assert "tests/test_calc.py::test_mul" in res.output.splitlines()[2]


@pytest.fixture(scope="module")
def prepared_image(docker_ready, instance):
    import docker

    repo, path, _ = instance
    [inst] = swebench.read_jsonl(path)
    tag = swebench.build_instance_image(inst, repo, f"horizon-swe-test:{RUN_ID}", labels={"horizon.test_run": RUN_ID})
    yield tag
    docker.from_env().images.remove(tag, force=True)


def test_swebench_from_prepared_image(docker_limits, instance, prepared_image):
    _, path, patches = instance
    [task] = swebench.load_swebench(path, images={"local/calc": prepared_image})
    assert task.files == {} and task.image == prepared_image
    assert _grade_patch(task, patches["gold"], docker_limits).reward == 1.0
    res = _grade_patch(task, patches["edits_tests"], docker_limits)   # restored by git checkout base_commit
    assert not res.infra and res.reward == 0.0, res.output


def test_dead_sandbox_is_infra(docker_ready, docker_limits, instance):
    repo, path, patches = instance
    [task] = swebench.load_swebench(path, repo_paths={"local/calc": str(repo)})
    with open_task_sandbox(task, backend="docker", **docker_limits) as sb:
        swebench.apply_patch(sb, patches["gold"])
        sb.container.kill()
        res = verify(task, sb)
    assert res.infra, res.output


HARBOR_FILES = {
    "task.toml": 'version = "1.0"\n[metadata]\ndifficulty = "easy"\n[verifier]\ntimeout_sec = 60.0\n'
                 '[agent]\ntimeout_sec = 60.0\n',
    "instruction.md": "Write the greeting that greet.py prints into /app/hello.txt.\n",
    "environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\nCOPY greet.py /app/greet.py\n",
    "environment/greet.py": "print('Hello, world!')\n",
    "solution/solve.sh": "#!/bin/bash\nset -e\npython3 greet.py > /app/hello.txt\n",
    "tests/test.sh": "#!/bin/bash\ncd /app\nif python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; "
                     "then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n",
    "tests/test_outputs.py": "def test_hello():\n    assert open('/app/hello.txt').read() == 'Hello, world!\\n'\n",
}


@pytest.fixture(scope="module")
def harbor_task(docker_ready, tmp_path_factory):
    import docker

    d = tmp_path_factory.mktemp("harbor") / f"hello-{RUN_ID}"
    for rel, text in HARBOR_FILES.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    task = harbor.load_harbor_dir(d, {"python:3.11-slim": docker_ready})
    assert harbor.build_image(task) == "built"
    assert harbor.build_image(task) == "skipped"
    yield task
    docker.from_env().images.remove(task.image, force=True)


@pytest.mark.parametrize("gold, want", [(True, 1.0), (False, 0.0)])
def test_harbor(harbor_task, docker_limits, gold, want):
    assert harbor_task.metadata["workdir"] == "/app" and "/app" in harbor_task.prompt
    with open_task_sandbox(harbor_task, backend="docker", **docker_limits) as sb:
        if gold:
            r = harbor.run_solution(harbor_task, sb)
            assert r.ok, r.output
        else:   # a stale reward file from the episode must not count
            sb.exec("echo 1 > /logs/verifier/reward.txt")
        res = verify(harbor_task, sb)
    assert not res.infra and res.reward == want, res.output
