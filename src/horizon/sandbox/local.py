"""Local sandbox backend: a temp directory + subprocess (docs/SPEC.md §5 fallback).

WARNING: NOT ISOLATED. Commands run as the calling user on the host, with the host's
network, filesystem, and no CPU/memory/pids limits. Use it only on a laptop without Docker
to develop tools and the agent loop against the same `Sandbox` protocol; never run
untrusted model output with it in earnest. `horizon.sandbox.open_sandbox("docker", ...)`
is the real backend.

Path mapping: the sandbox root is a host temp dir `root`; an absolute sandbox path `/p`
lives at `root/p` (so `/workspace/a.py` -> `root/workspace/a.py`) for `read_file`,
`write_file` and `workdir`. Inside `exec`, the literal path prefix `/workspace` in the
command text is rewritten to the real directory (and back in the output), so commands
such as `cd /workspace && pytest` work; other absolute paths in commands are the host's.
Timeouts kill the whole process group (SIGTERM, then SIGKILL after `KILL_GRACE_S`).
`snapshot()` copies the tree; `fork()` copies it into a new sandbox. `prepare()` kills every
process still carrying this sandbox's `HORIZON_SANDBOX_ROOT` in its environment (background
and `setsid` children of its commands; Linux /proc) and empties its /tmp; no budgets are
enforced (`disk_limit_mb` is accepted and ignored).
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from horizon.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_TIMEOUT_S,
    KILL_GRACE_S,
    WORKSPACE,
    ExecResult,
    OutputBuffer,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfraError,
    SandboxIsADirectoryError,
    SandboxPermissionError,
    check_command,
    check_path,
    metered,
)

_READ_CHUNK = 65536
# `/workspace` as a path prefix (not part of a longer name such as /workspaces or a/workspace).
_WS_RE = re.compile(r"(?<![\w./-])" + re.escape(WORKSPACE) + r"(?![\w.-])")


class LocalSandbox:
    """An UNISOLATED `Sandbox`: host temp dir + subprocess (see module docstring)."""

    isolated = False

    def __init__(self, root: str, *, default_timeout: float = DEFAULT_TIMEOUT_S,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES):
        if default_timeout <= 0 or max_output_bytes < 2:
            raise ValueError(f"bad limits: default_timeout={default_timeout} max_output_bytes={max_output_bytes}")
        self.root = os.path.realpath(root)
        self.default_timeout = float(default_timeout)
        self.max_output_bytes = int(max_output_bytes)
        self._closed = False
        self._snapshots: list[str] = []
        self._dangling: list = []   # (reader thread, pipe) of execs whose escaped children hold the pipe
        for d in (WORKSPACE, "/tmp"):   # the skeleton every sandbox has
            os.makedirs(self._host(d), exist_ok=True)

    @classmethod
    def create(cls, template: str | None = None, *, default_timeout: float = DEFAULT_TIMEOUT_S,
               max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, **_ignored_limits) -> LocalSandbox:
        """A fresh sandbox; `template` (a directory, e.g. a `snapshot()` ref) is copied as its root.

        Docker-only limits (cpus, mem_limit, pids_limit, network, user, labels) are accepted
        and ignored: this backend cannot enforce them.
        """
        root = tempfile.mkdtemp(prefix="horizon-local-")
        if template is not None:
            if not os.path.isdir(template):
                shutil.rmtree(root, ignore_errors=True)
                raise SandboxError(f"local sandbox template {template!r} is not a directory")
            shutil.copytree(template, root, symlinks=True, dirs_exist_ok=True)
        return cls(root, default_timeout=default_timeout, max_output_bytes=max_output_bytes)

    from_snapshot = create

    # -- paths ----------------------------------------------------------------------------
    def _host(self, path: str) -> str:
        """Host path of absolute sandbox path `path` (may not escape the root)."""
        check_path(path)
        rel = posixpath.normpath(path).lstrip("/")
        return os.path.join(self.root, rel) if rel else self.root

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxInfraError(f"local sandbox {self.root} is closed")

    # -- exec -----------------------------------------------------------------------------
    @metered
    def exec(self, cmd: str, timeout: float | None = None, workdir: str = WORKSPACE) -> ExecResult:
        """Run `cmd` with `bash -c` in `workdir`; kill its process group after `timeout` s."""
        return self._exec(cmd, timeout, workdir)

    def _exec(self, cmd: str, timeout: float | None, workdir: str) -> ExecResult:
        self._check_open()
        check_command(cmd)
        cwd = self._host(workdir)
        timeout = self.default_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        ws = self._host(WORKSPACE)
        buf = OutputBuffer(self.max_output_bytes)
        t0 = time.monotonic()
        if not os.path.isdir(cwd):
            buf.feed(f"bash: cd: {workdir}: No such file or directory\n".encode())
            out, trunc = buf.result()
            return ExecResult(1, out, False, trunc, time.monotonic() - t0)
        # The running interpreter's bin dir goes first on PATH so `python3 -m pytest` in task test
        # commands finds the same environment (with pytest) as the driver, like the Docker image does.
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        env = {**os.environ, "PATH": path, "HORIZON_SANDBOX_ROOT": self.root, "PWD": cwd,
               "TMPDIR": self._host("/tmp")}
        proc = subprocess.Popen(
            ["bash", "-c", _WS_RE.sub(lambda _: ws, cmd)], cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        reader = threading.Thread(target=_drain, args=(proc.stdout, buf), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        _killpg(proc.pid, signal.SIGKILL)   # also reaps background children left behind
        proc.wait()
        reader.join(KILL_GRACE_S)
        if reader.is_alive():   # a child that left the group (setsid) still holds the pipe: closing
            self._dangling.append((reader, proc.stdout))   # it now would deadlock; prepare/close do
        else:
            proc.stdout.close()
        out, truncated = buf.result()
        out = out.replace(ws, WORKSPACE)
        code = 124 if timed_out else proc.returncode
        if code < 0:   # killed by a signal: report like bash does (128 + signo)
            code = 128 - code
        return ExecResult(exit_code=code, output=out, timed_out=timed_out, truncated=truncated,
                          duration_s=time.monotonic() - t0)

    # -- files ----------------------------------------------------------------------------
    @metered
    def read_file(self, path: str) -> bytes:
        self._check_open()
        host = self._host(path)
        if os.path.isdir(host):
            raise SandboxIsADirectoryError(f"read_file: {path}: Is a directory")
        try:
            with open(host, "rb") as f:
                return f.read()
        except OSError as e:
            raise _file_error("read_file", path, e) from e

    @metered
    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        host = self._host(path)
        if path.endswith("/") or host == self.root or os.path.isdir(host):
            raise SandboxIsADirectoryError(f"write_file: {path}: Is a directory")
        payload = data.encode() if isinstance(data, str) else bytes(data)
        try:
            os.makedirs(os.path.dirname(host), exist_ok=True)
            with open(host, "wb") as f:
                f.write(payload)
            os.chmod(host, mode)
        except OSError as e:
            raise _file_error("write_file", path, e) from e

    # -- snapshot / fork ------------------------------------------------------------------
    def snapshot(self, tag: str | None = None) -> str:
        """Copy the whole tree; returns the copy's directory (a `create`/`from_snapshot` template).

        Snapshots are deleted by `close()`.
        """
        self._check_open()
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", tag or uuid.uuid4().hex[:12])
        dest = tempfile.mkdtemp(prefix=f"horizon-local-snap-{name}-")
        shutil.copytree(self.root, dest, symlinks=True, dirs_exist_ok=True)
        self._snapshots.append(dest)
        return dest

    def fork(self, *, workspace_only: bool = False) -> LocalSandbox:
        """An independent copy of this sandbox (`workspace_only` copies only WORKSPACE)."""
        self._check_open()
        child = LocalSandbox.create(default_timeout=self.default_timeout, max_output_bytes=self.max_output_bytes)
        src = self._host(WORKSPACE) if workspace_only else self.root
        dst = child._host(WORKSPACE) if workspace_only else child.root
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
        return child

    # -- lifecycle ------------------------------------------------------------------------
    def alive(self) -> bool:
        """True unless closed (the host is the sandbox)."""
        return not self._closed

    @metered
    def prepare(self, reset: str | None = None, *, workdir: str = WORKSPACE,
                timeout: float | None = None) -> ExecResult | None:
        """Ready for the next episode: kill the processes this sandbox's commands left behind
        (found by `HORIZON_SANDBOX_ROOT` in their environment), empty its /tmp; then `reset`
        (run like `exec`; its result is returned)."""
        self._check_open()
        self._clean()
        return None if reset is None else self._exec(reset, timeout, workdir)

    def _clean(self) -> None:
        for _ in range(20):   # a process may fork while we kill: repeat until none is left
            pids = _processes_with_env(f"HORIZON_SANDBOX_ROOT={self.root}")
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.02)
        else:
            raise SandboxInfraError(f"prepare: processes of local sandbox {self.root} survive SIGKILL")
        self._close_dangling()
        tmp = self._host("/tmp")
        if os.path.isdir(tmp):
            for name in os.listdir(tmp):
                p = os.path.join(tmp, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
        os.makedirs(tmp, exist_ok=True)

    def _close_dangling(self) -> None:
        """Close the pipes of earlier execs once their escaped children are gone."""
        keep = []
        for reader, pipe in self._dangling:
            reader.join(0.5)
            if reader.is_alive():
                keep.append((reader, pipe))
            else:
                pipe.close()
        self._dangling = keep

    def close(self) -> None:
        """Delete the root and snapshots (and kill processes left behind). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for pid in _processes_with_env(f"HORIZON_SANDBOX_ROOT={self.root}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._close_dangling()
        for d in [self.root, *self._snapshots]:
            shutil.rmtree(d, ignore_errors=True)
        self._snapshots.clear()

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalSandbox({self.root!r}, {'closed' if self._closed else 'open'}, UNISOLATED)"


def _file_error(op: str, path: str, e: OSError) -> SandboxError:
    msg = f"{op}: {path}: {e.strerror or e}"
    if isinstance(e, FileNotFoundError):
        return SandboxFileNotFoundError(msg)
    if isinstance(e, PermissionError):
        return SandboxPermissionError(msg)
    if isinstance(e, IsADirectoryError):
        return SandboxIsADirectoryError(msg)
    return SandboxError(msg)


def _processes_with_env(entry: str) -> list[int]:
    """Pids (not ours) whose environment holds `entry` ("KEY=value"); [] without /proc."""
    want, me, pids = entry.encode(), os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if want in env.split(b"\0"):
            pids.append(int(name))
    return pids


def _drain(pipe, buf: OutputBuffer) -> None:
    try:
        while chunk := pipe.read1(_READ_CHUNK):
            buf.feed(chunk)
    except (OSError, ValueError):
        pass


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
