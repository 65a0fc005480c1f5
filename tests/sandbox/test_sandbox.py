"""Behaviour of the Sandbox protocol, identical for both backends (docs/SPEC.md §5)."""

import time

import pytest

from horizon.sandbox import TRUNCATION_MARKER, WORKSPACE, Sandbox, SandboxError, SandboxFileNotFoundError
from horizon.sandbox.base import KILL_GRACE_S

# Engine round trips on a loaded 2-core CI box take up to a few seconds; a timeout must
# still end within timeout + kill grace + this slack (the docker backstop fires at +5 s).
TIMEOUT_SLACK_S = 4.0
MAX_OUTPUT = 1000   # = conftest.MAX_OUTPUT, the cap every test sandbox gets


def test_satisfies_protocol(sandbox):
    assert isinstance(sandbox, Sandbox)


def test_exec_exit_codes_and_output(sandbox):
    r = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.timed_out, r.truncated, r.ok) == (3, False, False, False)
    assert "out\n" in r.output and "err\n" in r.output   # stderr is merged into the output
    r = sandbox.exec("pwd && true")
    assert r.ok and r.output == WORKSPACE + "\n"
    assert sandbox.exec("pwd", workdir="/tmp").output.strip().endswith("/tmp")
    r = sandbox.exec("echo never", workdir="/does/not/exist")
    assert r.exit_code != 0 and "never" not in r.output
    assert sandbox.exec("false").exit_code == 1


def test_state_persists_between_execs(sandbox):
    assert sandbox.exec("echo hello > /workspace/note.txt").ok
    assert sandbox.exec("cat note.txt").output == "hello\n"
    assert sandbox.read_file("/workspace/note.txt") == b"hello\n"


def test_output_truncation_keeps_head_and_tail(sandbox):
    r = sandbox.exec("echo START; head -c 20000 /dev/zero | tr '\\0' x; echo; echo END")
    assert r.ok and r.truncated
    head, marker_tail = r.output.split("\n[... output truncated: ", 1)
    assert head.startswith("START\n")
    omitted = int(marker_tail.split(" ", 1)[0])
    assert TRUNCATION_MARKER.format(omitted=omitted) in r.output
    assert r.output.endswith("x\nEND\n")
    total = len("START\n") + 20000 + len("\nEND\n")
    assert omitted == total - MAX_OUTPUT   # exactly MAX_OUTPUT bytes kept
    small = sandbox.exec("echo short")
    assert not small.truncated and small.output == "short\n"


def test_write_read_roundtrip(sandbox):
    blob = bytes(range(256)) * 300   # binary incl. NUL and invalid UTF-8, 76.8 kB
    sandbox.write_file("/workspace/deep/er/dir/blob.bin", blob)
    assert sandbox.read_file("/workspace/deep/er/dir/blob.bin") == blob
    sandbox.write_file("/workspace/t.py", "print('héllo')\n", mode=0o755)
    assert sandbox.read_file("/workspace/t.py") == "print('héllo')\n".encode()
    r = sandbox.exec("stat -c %a t.py && ./t.py 2>&1 || python3 t.py; wc -c < deep/er/dir/blob.bin")
    assert r.output.split()[0] == "755" and str(len(blob)) in r.output
    sandbox.write_file("/workspace/t.py", b"overwritten")   # overwrite shrinks the file
    assert sandbox.read_file("/workspace/t.py") == b"overwritten"
    sandbox.write_file("/tmp/elsewhere/x", b"1")            # absolute paths outside the workspace
    assert sandbox.read_file("/tmp/elsewhere/x") == b"1"
    assert sandbox.exec("cat deep/er/dir/../../../t.py").output == "overwritten"


def test_file_errors(sandbox):
    with pytest.raises(SandboxFileNotFoundError):
        sandbox.read_file("/workspace/missing.txt")
    with pytest.raises(FileNotFoundError):   # also catchable as the builtin
        sandbox.read_file("/workspace/missing.txt")
    with pytest.raises(SandboxError, match="directory"):
        sandbox.read_file("/workspace")
    with pytest.raises(SandboxError, match="absolute"):
        sandbox.write_file("relative.txt", b"x")


def test_timeout_kills_command_not_sandbox(sandbox):
    t0 = time.monotonic()
    r = sandbox.exec("echo begun; sleep 1000", timeout=1.0)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code in (124, 137) and not r.ok
    assert "begun" in r.output   # output produced before the kill is kept
    assert elapsed < 1.0 + KILL_GRACE_S + TIMEOUT_SLACK_S
    # A command that ignores SIGTERM is SIGKILLed after the grace period.
    r = sandbox.exec("trap '' TERM; sleep 1001; echo survived", timeout=1.0)
    assert r.timed_out and "survived" not in r.output
    assert time.monotonic() - t0 < 2 * (1.0 + KILL_GRACE_S + TIMEOUT_SLACK_S)
    # The sandbox keeps working and nothing of the killed commands is left running.
    r = sandbox.exec("echo alive; ps -eo args | grep -c '^sleep 100[01]$' || true", timeout=10)
    assert r.ok and r.output.split() == ["alive", "0"]
    quick = sandbox.exec("exit 124")   # exiting 124 on its own is not a timeout
    assert quick.exit_code == 124 and not quick.timed_out


@pytest.mark.parametrize("workspace_only", [False, True])
def test_fork_sees_parent_files_and_diverges(make, workspace_only):
    with make() as parent:
        parent.write_file("/workspace/shared.txt", b"v1")
        parent.exec("mkdir -p pkg && echo 'x = 1' > pkg/mod.py && ln -s shared.txt link")
        with parent.fork(workspace_only=workspace_only) as child:
            assert child.read_file("/workspace/shared.txt") == b"v1"
            assert child.exec("cat pkg/mod.py link").output == "x = 1\nv1"
            assert child.exec("stat -c %u shared.txt").output == parent.exec("stat -c %u shared.txt").output
            child.write_file("/workspace/shared.txt", b"child")
            parent.write_file("/workspace/shared.txt", b"parent")
            child.exec("rm pkg/mod.py")
            assert parent.read_file("/workspace/shared.txt") == b"parent"
            assert child.read_file("/workspace/shared.txt") == b"child"
            assert parent.exec("test -f pkg/mod.py").ok and not child.exec("test -f pkg/mod.py").ok


def test_snapshot_freezes_state(make, backend):
    with make() as sb:
        sb.write_file("/workspace/state.txt", b"before")
        ref = sb.snapshot("test-snap")
        sb.write_file("/workspace/state.txt", b"after")
        with type(sb).from_snapshot(ref, **({"labels": sb._spec["labels"]} if backend == "docker" else {})) as back:
            assert back.read_file("/workspace/state.txt") == b"before"
        assert sb.read_file("/workspace/state.txt") == b"after"


def test_close_idempotent_and_context_manager(make):
    with make() as sb:
        assert sb.exec("true").ok
    sb.close()   # second close: no error
    with pytest.raises(SandboxError, match="closed"):
        sb.exec("true")
    with pytest.raises(SandboxError):
        sb.read_file("/workspace/x")


def test_prepare_runs_the_reset_in_the_same_action(sandbox):
    from horizon.sandbox.base import meter_of

    sandbox.exec("echo stale > ${TMPDIR:-/tmp}/left; echo old > /workspace/f")
    n = meter_of(sandbox).actions
    r = sandbox.prepare("printf %s new > /workspace/f && echo reset-out && exit 3", workdir="/")
    assert meter_of(sandbox).actions == n + 1              # one action: prepare and the reset
    assert r.exit_code == 3 and r.output == "reset-out\n" and not r.timed_out
    assert sandbox.read_file("/workspace/f") == b"new"
    assert sandbox.exec("ls ${TMPDIR:-/tmp}").output == ""   # prepare's cleanup ran first
    assert sandbox.prepare() is None
