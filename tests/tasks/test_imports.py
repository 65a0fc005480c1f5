"""SWE-bench JSONL and Harbor importers: parsing, one-line errors, report parsing (no Docker)."""

import json

import pytest

from horizon.tasks import harbor, swebench
from horizon.tasks.task import TaskError

ROW = {"instance_id": "Local__calc-1", "repo": "local/calc", "base_commit": "abc", "patch": "diff",
       "test_patch": "diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n"
                     "+++ b/tests/test_calc.py\n@@ -1 +1,2 @@\n x\n+y\n",
       "problem_statement": "add is wrong", "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
       "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mul", "tests/test_other.py::test_x"])}


def test_parse_row_and_roundtrip(tmp_path):
    inst = swebench.parse_instance(ROW)
    assert inst.fail_to_pass == ("tests/test_calc.py::test_add",)
    assert swebench.test_files(inst) == ["tests/test_calc.py", "tests/test_other.py"]
    assert swebench.patch_files(inst.test_patch) == ["tests/test_calc.py"]
    assert swebench.task_id_for(inst.instance_id) == "local__calc-1"
    path = tmp_path / "set.jsonl"
    swebench.write_jsonl([inst], path)
    assert swebench.read_jsonl(path) == [inst]


@pytest.mark.parametrize("line, match", [
    ("{not json", r"set.jsonl:1: malformed JSON"),
    (json.dumps({k: v for k, v in ROW.items() if k != "patch"}), r"missing field\(s\) \['patch'\]"),
    (json.dumps({**ROW, "FAIL_TO_PASS": "[oops"}), "FAIL_TO_PASS is not a JSON-encoded list"),
    (json.dumps({**ROW, "FAIL_TO_PASS": "[]"}), "FAIL_TO_PASS is empty"),
    (json.dumps({**ROW, "PASS_TO_PASS": json.dumps([1])}), "PASS_TO_PASS must be a list of test ids"),
])
def test_malformed_rows_one_line(tmp_path, line, match):
    path = tmp_path / "set.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TaskError, match=match) as e:
        swebench.read_jsonl(path)
    assert "\n" not in str(e.value)


def test_instance_without_repository(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    with pytest.raises(TaskError, match="repo 'local/calc' has no local path"):
        swebench.load_swebench(path)


def test_parse_test_report():
    out = "\n".join(["tests/t.py::test_a PASSED", "=== short test summary info ===",
                     "PASSED tests/t.py::test_a", "FAILED tests/t.py::test_b - AssertionError: 1 != 2",
                     "ERROR tests/t.py::test_c - RuntimeError", "XFAIL tests/t.py::test_d - reason",
                     "PASSED tests/t.py::test_e[x-1]", "ERROR tests/t.py::test_e[x-1] - teardown"])
    assert swebench.parse_test_report(out) == {"tests/t.py::test_a": "PASSED", "tests/t.py::test_b": "FAILED",
                                               "tests/t.py::test_c": "ERROR", "tests/t.py::test_d": "XFAIL",
                                               "tests/t.py::test_e[x-1]": "ERROR"}


def test_rewrite_dockerfile_maps_from():
    text = "FROM python:3.11-slim AS build\nRUN true\nFROM build\nWORKDIR /app\nCOPY x /app/x\n"
    out, workdir = harbor.rewrite_dockerfile(text, {"python": "horizon-sandbox:base"})
    assert workdir == "/app"
    lines = out.splitlines()
    assert lines[:2] == ["FROM horizon-sandbox:base AS build", "USER root"]
    assert "FROM build" in lines and lines[-1] == "USER 1000:1000" and "chown -R 1000:1000" in lines[-2]
    with pytest.raises(TaskError, match="FROM ubuntu:24.04 is not mapped to a local image"):
        harbor.rewrite_dockerfile("FROM ubuntu:24.04\n", {"python:3.11-slim": "horizon-sandbox:base"})


def test_harbor_missing_file(tmp_path):
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "task.toml").write_text('version = "1.0"\n')
    (tmp_path / "t1" / "instruction.md").write_text("do it\n")
    with pytest.raises(TaskError, match=r"t1: missing environment/Dockerfile"):
        harbor.load_harbor_dir(tmp_path / "t1", {"*": "horizon-sandbox:base"})


def test_parse_reward():
    assert harbor.parse_reward("1\n") == 1.0 and harbor.parse_reward(" 0.5 ") == 0.5
    assert harbor.parse_reward("passed") is None
