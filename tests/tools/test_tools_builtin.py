"""Each built-in tool against the real LocalSandbox and (docker-marked) DockerSandbox (docs/SPEC.md §5)."""

import pytest

from horizon.tools import ToolContext, ToolState, make_registry
from horizon.tools.builtin import BUILTIN_TOOLS

SRC = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n"


@pytest.fixture
def ctx(sandbox):
    sandbox.exec("rm -rf /workspace/* /workspace/.hidden", workdir="/workspace")
    sandbox.write_file("/workspace/pkg/mod.py", SRC)
    sandbox.write_file("/workspace/.hidden", "secret")
    return ToolContext(sandbox, ToolState(), timeout_s=10, max_timeout_s=1, max_observation_bytes=600)


@pytest.fixture
def reg():
    return make_registry(strict=True)


def run(reg, ctx, name, **args):
    return reg.execute(name, {k: v if isinstance(v, str) else __import__("json").dumps(v) for k, v in args.items()},
                       ctx)


def test_read_file_numbering_and_ranges(reg, ctx):
    r = run(reg, ctx, "read_file", path="/workspace/pkg/mod.py")
    assert not r.error and r.output.split("\n")[0] == "     1\tdef f(x):" and r.output.count("\n") == 5
    r = run(reg, ctx, "read_file", path="/workspace/pkg/mod.py", start_line=5, end_line=-1)
    assert r.output == "     5\tdef g(x):\n     6\t    return x + 1"
    assert "out of range" in run(reg, ctx, "read_file", path="/workspace/pkg/mod.py", start_line=9).output
    r = run(reg, ctx, "read_file", path="/workspace/nope.py")
    assert r.error and "does not exist" in r.output
    assert "must be absolute" in run(reg, ctx, "read_file", path="pkg/mod.py").output
    assert "is a directory" in run(reg, ctx, "read_file", path="/workspace/pkg").output


def test_edit_str_replace_unique_match(reg, ctx):
    r = run(reg, ctx, "edit_file", command="str_replace", path="/workspace/pkg/mod.py", old_str="    return x + 1",
            new_str="    return x + 2")
    assert r.error and "Multiple occurrences" in r.output and "lines [2, 6]" in r.output
    r = run(reg, ctx, "edit_file", command="str_replace", path="/workspace/pkg/mod.py", old_str="return y",
            new_str="z")
    assert r.error and "did not appear verbatim" in r.output
    r = run(reg, ctx, "edit_file", command="str_replace", path="/workspace/pkg/mod.py",
            old_str="def g(x):\n    return x + 1", new_str="def g(x):\n    return x * 2")
    assert not r.error and "     6\t    return x * 2" in r.output
    assert ctx.sandbox.read_file("/workspace/pkg/mod.py").decode() == (
        "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x * 2\n")


def test_edit_create_and_insert(reg, ctx):
    r = run(reg, ctx, "edit_file", command="create", path="/workspace/pkg/mod.py", file_text="x")
    assert r.error and "already exists" in r.output
    assert not run(reg, ctx, "edit_file", command="create", path="/workspace/new/dir/n.txt", file_text="a\nb\n").error
    assert ctx.sandbox.read_file("/workspace/new/dir/n.txt") == b"a\nb\n"
    assert not run(reg, ctx, "edit_file", command="insert", path="/workspace/new/dir/n.txt", insert_line=1,
                   new_str="mid").error
    assert ctx.sandbox.read_file("/workspace/new/dir/n.txt") == b"a\nmid\nb\n"
    run(reg, ctx, "edit_file", command="insert", path="/workspace/new/dir/n.txt", insert_line=0, new_str="top")
    assert ctx.sandbox.read_file("/workspace/new/dir/n.txt") == b"top\na\nmid\nb\n"
    r = run(reg, ctx, "edit_file", command="insert", path="/workspace/new/dir/n.txt", insert_line=9, new_str="x")
    assert r.error and "out of range [0, 4]" in r.output
    assert "needs parameter 'old_str'" in run(reg, ctx, "edit_file", command="str_replace",
                                               path="/workspace/pkg/mod.py").output
    assert "must be one of" in run(reg, ctx, "edit_file", command="delete", path="/workspace/pkg/mod.py").output


def test_run_shell_exit_code_timeout_truncation(reg, ctx):
    r = run(reg, ctx, "run_shell", command="echo hi; exit 3")
    assert r.output == "hi\n[exit code: 3]"
    r = run(reg, ctx, "run_shell", command="pwd && ls")
    assert r.output.startswith("/workspace\npkg") and r.output.endswith("[exit code: 0]")
    # timeout capped at max_timeout_s=1 although 100 was requested
    r = run(reg, ctx, "run_shell", command="sleep 20", timeout=100)
    assert "timed out after 1s" in r.output
    r = run(reg, ctx, "run_shell", command="seq 1 2000")
    assert "output truncated" in r.output and r.output.startswith("1\n2\n") and "[exit code: 0]" in r.output
    assert len(r.output.encode()) < 600 + 100   # cap + marker


def test_grep_and_list_dir(reg, ctx):
    r = run(reg, ctx, "grep", pattern="def [fg]\\(", path="/workspace")
    assert r.output.splitlines() == ["/workspace/pkg/mod.py:1:def f(x):", "/workspace/pkg/mod.py:5:def g(x):"]
    assert "No matches" in run(reg, ctx, "grep", pattern="zzz").output
    assert "/workspace/pkg/mod.py:" in run(reg, ctx, "grep", pattern="return", include="*.py").output
    r = run(reg, ctx, "list_dir", path="/workspace")
    assert r.output.splitlines()[1:] == ["/workspace/pkg/", "/workspace/pkg/mod.py"]   # .hidden omitted
    assert "not a directory" in run(reg, ctx, "list_dir", path="/workspace/pkg/mod.py").output


def test_todo_write_counts(reg, ctx):
    todos = [{"content": "a", "status": "pending"}, {"content": "b", "status": "in_progress"}]
    r = run(reg, ctx, "todo_write", todos=todos)
    assert "[ ] a" in r.output and "[~] b" in r.output
    run(reg, ctx, "todo_write", todos=[{"content": "a", "status": "completed"}, {"content": "c"}])
    assert (ctx.state.todos_created, ctx.state.todos_completed) == (3, 1)
    assert ctx.state.remaining_todos() == ["c"]
    assert run(reg, ctx, "todo_write", todos='[{"content": 1}]').error
    assert "JSON list" in run(reg, ctx, "todo_write", todos="not json").output


def test_strict_vs_lenient(ctx):
    strict, lenient = make_registry(strict=True), make_registry(strict=False)
    args = {"path": "/workspace/pkg/mod.py", "color": "red"}
    r = strict.execute("read_file", args, ctx)
    assert r.error and "unknown parameter(s) ['color']" in r.output
    assert not lenient.execute("read_file", args, ctx).error
    assert "must be an integer" in strict.execute("read_file", {"path": "/workspace/pkg/mod.py",
                                                                "start_line": "two"}, ctx).output
    assert "missing required parameter 'path'" in lenient.execute("read_file", {}, ctx).output
    assert "unknown tool 'rm_rf'" in strict.execute("rm_rf", {}, ctx).output
    sub = make_registry(["read_file", "grep"], strict=True)
    assert sub.names == ["read_file", "grep"] and sub.execute("edit_file", {}, ctx).error
    with pytest.raises(ValueError):
        make_registry(["web_search"])
    assert set(BUILTIN_TOOLS) == {"read_file", "edit_file", "run_shell", "grep", "list_dir", "todo_write"}
