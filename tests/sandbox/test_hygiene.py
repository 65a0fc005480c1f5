"""docs/SPEC.md §4.1 "infrastructure is not the policy", sandbox side: whose failure an error is, file
ops as the sandbox user, `prepare()` hygiene between pooled episodes, the disk budget watchdog, leaked
snapshot cleanup.

Docker cases share one sandbox per module where the case leaves it usable (`box`); cases that
break a sandbox on purpose (kill, OOM limits, disk budget) make their own.
"""

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from horizon.sandbox import (
    PROJECT_LABEL,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfraError,
    SandboxResourceError,
    open_sandbox,
)
from horizon.sandbox.base import SandboxArgumentError, SandboxIsADirectoryError, SandboxPermissionError

REPO = Path(__file__).resolve().parents[2]
docker_only = pytest.mark.docker


@pytest.fixture(scope="module")
def box(docker_image):
    """One Docker sandbox for the cases that leave it usable."""
    sb = open_sandbox("docker", docker_image, default_timeout=30, max_output_bytes=4000,
                      labels={"horizon.test_run": "hygiene-" + uuid.uuid4().hex[:8]})
    yield sb
    sb.close()


# -- both backends ----------------------------------------------------------------------------
def test_invalid_paths_and_commands_rejected_before_running(sandbox):
    for bad in ("", "relative.txt", "/workspace/a\x00b"):
        with pytest.raises(SandboxArgumentError):
            sandbox.write_file(bad, b"x")
        with pytest.raises(ValueError):   # also catchable as the builtin
            sandbox.read_file(bad)
    with pytest.raises(SandboxArgumentError, match="NUL"):
        sandbox.exec("echo a\x00b")
    with pytest.raises(SandboxArgumentError, match="NUL"):
        sandbox.exec("true", workdir="/work\x00space")
    assert not sandbox.exec("ls /workspace/a").ok   # the NUL path did not write its prefix instead
    with pytest.raises(SandboxIsADirectoryError):
        sandbox.write_file("/workspace/", b"x")


def test_prepare_kills_background_processes_and_empties_tmp(sandbox):
    assert sandbox.alive()
    r = sandbox.exec("nohup sleep 1001 > /dev/null 2>&1 & setsid sleep 1002 > /dev/null 2>&1 & "
                     "(setsid bash -c 'sleep 1003' > /dev/null 2>&1 &) ; echo x > ${TMPDIR:-/tmp}/leftover; "
                     "echo started")
    assert r.ok and "started" in r.output
    sandbox.write_file("/workspace/keep.txt", b"kept")
    sandbox.prepare()
    r = sandbox.exec("ps -eo args | grep -c '^sleep 100[123]$'; ls -A ${TMPDIR:-/tmp}", timeout=10)
    assert r.output.split() == ["0"], r.output
    assert sandbox.read_file("/workspace/keep.txt") == b"kept"   # the workspace is the caller's
    assert sandbox.exec("echo ok").output == "ok\n"
    sandbox.prepare()   # idempotent on a clean sandbox


def test_local_escaped_child_holding_the_output_pipe():
    """A local-backend regression (Docker's engine closes the stream itself)."""
    from horizon.sandbox import LocalSandbox

    with LocalSandbox.create() as sb:
        t0 = time.monotonic()
        r = sb.exec("(setsid bash -c 'sleep 1004' &) ; echo started")   # keeps the exec's stdout open
        assert r.ok and r.output == "started\n" and time.monotonic() - t0 < 10
        sb.prepare()   # kills it and closes the pipe it held
        assert sb.exec("ps -eo args | grep -c '^sleep 1004$'").output.split() == ["0"]
        assert sb._dangling == []


# -- docker: file operations run as the sandbox user -------------------------------------------
@docker_only
def test_file_ops_run_as_sandbox_user(box):
    passwd = box.exec("md5sum /etc/passwd").output
    with pytest.raises(SandboxPermissionError, match="/etc/shadow: Permission denied"):
        box.read_file("/etc/shadow")
    with pytest.raises(PermissionError):
        box.read_file("/etc/shadow")
    for target in ("/etc/passwd", "/usr/bin/x", "/etc/newdir/f"):
        with pytest.raises(SandboxPermissionError, match="Permission denied"):
            box.write_file(target, "pwned\n")
    box.exec("rm -f /workspace/etc_link /workspace/pw_link; ln -s /etc /workspace/etc_link; "
             "ln -s /etc/passwd /workspace/pw_link")
    for through in ("/workspace/etc_link/passwd", "/workspace/etc_link/evil", "/workspace/pw_link"):
        with pytest.raises(SandboxPermissionError, match="Permission denied"):
            box.write_file(through, "pwned\n")
    assert box.exec("md5sum /etc/passwd").output == passwd
    assert box.exec("ls /etc/evil /usr/bin/x 2>&1 | grep -c 'No such'").output.strip() == "2"
    # Symlinks resolve inside the sandbox, readable targets read fine.
    assert box.read_file("/workspace/etc_link/hostname") == b"sandbox\n"
    with pytest.raises(SandboxFileNotFoundError, match="No such file or directory"):
        box.read_file("/workspace/missing")
    with pytest.raises(SandboxIsADirectoryError, match="Is a directory"):
        box.read_file("/workspace")
    with pytest.raises(SandboxError, match="not a regular file"):
        box.read_file("/dev/zero")
    # Created as the user, parents included; mode applied; binary and large payloads intact.
    blob = os.urandom(3 << 20)
    box.write_file("/workspace/new/sub/blob.bin", blob, mode=0o600)
    assert box.read_file("/workspace/new/sub/blob.bin") == blob
    assert box.exec("stat -c '%u %a' new new/sub new/sub/blob.bin").output.split() == [
        "1000", "755", "1000", "755", "1000", "600"]
    box.write_file("/workspace/new/sub/blob.bin", b"")   # overwrite with nothing
    assert box.read_file("/workspace/new/sub/blob.bin") == b""


@docker_only
def test_prepare_cleans_scratch_but_not_image_files(box):
    box.exec("mkdir -p /tmp/d/e && echo 1 > /tmp/d/e/f && chmod 000 /tmp/d; echo 2 > /var/tmp/v; "
             "echo 3 > /dev/shm/s; echo 4 > ~/new_in_home; mkdir -p ~/.cache/x && echo 5 > ~/.cache/x/y")
    before = box.exec("ls -A ~").output.split()
    box.prepare()
    r = box.exec("ls -A /tmp /var/tmp /dev/shm | grep -v ':$' | grep -c . ; ls -A ~; ls -A ~/.cache/x | wc -l")
    lines = r.output.split()
    assert lines[0] == "0" and lines[-1] == "0", r.output
    home = lines[1:-1]
    assert "new_in_home" not in home and ".bashrc" in home   # files the image put there stay
    assert set(home) == set(before) - {"new_in_home"}


@docker_only
def test_sandbox_user_cannot_kill_the_sandbox(box):
    assert box.exec("ps -o user= -p 1").output.strip() == "root"   # keep-alive: out of reach
    r = box.exec("kill -9 -1")   # every process of the user but the caller, not the box
    # docker-exec: the wrapper `timeout` dies (137); in-box executor: the shell itself survives, as POSIX says
    assert r.exit_code == (137 if box.executor == "docker-exec" else 0) and not r.timed_out
    assert box.alive() and box.exec("id -u").output == "1000\n"


@docker_only
def test_fork_bomb_then_prepare_recovers(docker_make):
    sb = docker_make(pids_limit=64)
    r = sb.exec(":(){ :|:& };:", timeout=3)
    assert not r.timed_out or r.exit_code in (124, 137)
    sb.prepare()   # kills every process of the user; raises SandboxInfraError if it cannot
    r = sb.exec("echo ok; ps -e --no-headers | wc -l", timeout=10)
    assert r.ok and r.output.split()[0] == "ok"
    assert int(r.output.split()[1]) < 10   # init, keep-alive, this command


# -- docker: infrastructure failures are SandboxInfraError -------------------------------------
@docker_only
def test_container_killed_mid_exec_is_infra(docker_make):
    sb = docker_make()
    killer = threading.Timer(1.0, lambda: sb.container.kill())
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(SandboxInfraError, match="died while the command ran"):
        sb.exec("sleep 5", timeout=30)
    assert time.monotonic() - t0 < 5
    killer.join()
    assert not sb.alive()
    with pytest.raises(SandboxInfraError, match="not running"):
        sb.exec("true")
    with pytest.raises(SandboxInfraError):
        sb.read_file("/etc/hostname")
    with pytest.raises(SandboxInfraError):
        sb.prepare()
    sb.close()
    assert not sb.alive()
    with pytest.raises(SandboxInfraError, match="closed"):
        sb.exec("true")


@docker_only
def test_oom_kill_is_told_apart_from_a_plain_kill(docker_make):
    sb = docker_make(mem_limit="64m")
    r = sb.exec("python3 -c \"b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ALLOC')\"",
                timeout=30)
    assert r.exit_code == 137 and not r.timed_out and "ALLOC" not in r.output
    assert "[sandbox] killed: out of memory (limit 64 MiB)" in r.output
    r = sb.exec("echo before; kill -9 $$", timeout=30)   # killed, but not by the OOM killer
    assert r.exit_code == 137 and r.output == "before\n"
    assert sb.alive() and sb.exec("echo alive").output == "alive\n"


class _SilentEngine:
    """A unix socket that accepts connections and never answers (a hung Docker engine)."""

    def __init__(self):
        self.path = os.path.join(tempfile.mkdtemp(prefix="hung-engine-"), "docker.sock")
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@docker_only
def test_hung_engine_call_is_infra_not_a_hang(docker_make):
    import docker

    box = docker_make(executor="docker-exec")   # one engine call per action (the in-box executor makes none)
    engine = _SilentEngine()
    hung = docker.DockerClient(base_url=f"unix://{engine.path}", timeout=1, version="1.41")
    try:
        from horizon.sandbox.docker import DockerSandbox

        t0 = time.monotonic()
        with pytest.raises(SandboxInfraError, match="did not answer in time"):
            DockerSandbox.create(client=hung)
        real = box._client
        box._client = hung
        try:
            with pytest.raises(SandboxInfraError, match="did not answer in time"):
                box.exec("true")
            with pytest.raises(SandboxInfraError):
                box.read_file("/etc/hostname")
            assert not box.alive()
        finally:
            box._client = real
        assert time.monotonic() - t0 < 15
        assert box.exec("echo fine").output == "fine\n"
    finally:
        hung.close()
        engine.close()


# -- docker: disk budget -----------------------------------------------------------------------
def _reset(sb) -> float:
    """A family reset (one exec that empties the workspace first); the MiB it found there."""
    r = sb.exec("du -sk /workspace | cut -f1; find /workspace -mindepth 1 -delete")
    assert r.ok, r.output
    return int(r.output.split()[0]) / 1024


@docker_only
@pytest.mark.parametrize("method", ["auto", "exec"])
def test_disk_budget_watchdog(docker_make, monkeypatch, method):
    import horizon.sandbox.docker as dmod

    monkeypatch.setattr(dmod, "DISK_USAGE_METHOD", method)
    sb = docker_make(disk_limit_mb=64)
    assert (sb._upper is None) == (method == "exec" or os.geteuid() != 0)
    assert sb.disk_usage_bytes() < 1 << 20
    assert sb.exec("echo small > s.txt").ok   # within budget: nothing happens
    with pytest.raises(SandboxResourceError, match=r"\[sandbox\] disk budget exceeded: \d+ MiB > 64 MiB"):
        sb.exec("dd if=/dev/zero of=/workspace/big bs=1M count=200", timeout=60)
    with pytest.raises(SandboxResourceError):   # until prepare()
        sb.exec("true")
    with pytest.raises(SandboxResourceError):
        sb.write_file("/workspace/t", "x")
    sb.prepare()
    assert 60 < _reset(sb) < 70                  # stopped at the budget, far below 200 MiB
    assert sb.exec("echo works").output == "works\n"
    if method == "auto":   # many small files: the watchdog thread stops the writer mid-command
        t0 = time.monotonic()
        with pytest.raises(SandboxResourceError):
            sb.exec("for i in $(seq 300); do head -c 10M /dev/zero > /workspace/f$i; done", timeout=120)
        assert time.monotonic() - t0 < 30
        sb.prepare()
        assert _reset(sb) < 1000                   # 3000 MiB were on the way
        with pytest.raises(SandboxResourceError):   # write_file counts too
            sb.write_file("/workspace/w.bin", b"\0" * (70 << 20))
        sb.prepare()
        _reset(sb)
    child = sb.fork(workspace_only=True)           # forks inherit the budget
    try:
        assert child.disk_limit_mb == 64
        with pytest.raises(SandboxResourceError):
            child.exec("dd if=/dev/zero of=/workspace/big bs=1M count=100", timeout=60)
    finally:
        child.close()


# -- docker: leaked snapshot images --------------------------------------------------------------
_SNAPSHOT_CRASHER = """
import os, sys
from horizon.sandbox.docker import DockerSandbox
key, val = sys.argv[1], sys.argv[2]
sb = DockerSandbox.create(labels={key: val})
sb.write_file("/workspace/x", "1")
print("snapshot", sb.snapshot(), flush=True)
os._exit(0)   # no atexit cleanup: container and image leak
"""


@docker_only
def test_cleanup_leaked_removes_dead_owners_snapshot_images(docker_image, run_label):
    import docker

    from horizon.sandbox.docker import LABEL_KIND, cleanup_leaked

    client = docker.from_env()
    (key, val), = run_label.items()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    p = subprocess.run([sys.executable, "-c", _SNAPSHOT_CRASHER, key, val], env=env, capture_output=True,
                       text=True, timeout=180)
    assert "snapshot" in p.stdout, p.stderr
    image_id = p.stdout.split()[-1]
    flt = {"label": [f"{LABEL_KIND}=snapshot", f"{key}={val}"]}
    assert image_id in [im.id for im in client.images.list(filters=flt)]
    cleanup_leaked(only_dead_owners=True, labels=run_label)
    assert client.images.list(filters=flt) == []
    assert client.containers.list(all=True, filters={"label": [PROJECT_LABEL, f"{key}={val}"]}) == []
