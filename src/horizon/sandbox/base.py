"""The sandbox protocol every backend implements (docs/SPEC.md §5).

Tools and the agent loop talk only to this protocol. Paths are absolute paths inside
the sandbox; the task workspace is `WORKSPACE`. Backends: `DockerSandbox` (the real
one, isolated) and `LocalSandbox` (temp dir + subprocess, NOT isolated, a fallback for
laptops without Docker).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from typing import Protocol, runtime_checkable

from horizon.sandbox.inbox import OutputBuffer  # one implementation, also run in the box

WORKSPACE = "/workspace"
TRUNCATION_MARKER = OutputBuffer.MARKER
PROJECT_LABEL = "horizon.sandbox"  # label key set on every container/image we create

# Defaults shared by both backends (callers normally pass values from their config).
DEFAULT_BASE_IMAGE = os.environ.get("HORIZON_BASE_IMAGE", "horizon-sandbox:base")
DEFAULT_TIMEOUT_S = 60.0            # per-exec wall-clock limit when `exec(timeout=None)`
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024  # bytes of output kept per exec (head + tail)
KILL_GRACE_S = 2                    # `timeout -k`: SIGKILL this long after SIGTERM
TIMEOUT_EXIT_CODES = (124, 137)     # GNU timeout: 124 after SIGTERM, 137 after SIGKILL


class SandboxError(RuntimeError):
    """A sandbox operation failed. A plain `SandboxError` or the file/argument subclasses below
    are the policy's doing (a bad path, a file it may not write) and go back to it as text;
    `SandboxInfraError` (engine / dead container) and `SandboxResourceError` (budget) end the
    episode (docs/SPEC.md §4.1 "infrastructure is not the policy")."""


class SandboxInfraError(SandboxError):
    """The sandbox or the engine failed (dead / removed / unusable container, engine error or
    timeout): infrastructure, never the policy's doing (docs/SPEC.md §4 "infrastructure is not the
    policy"). Tools and the verifier let it propagate; the episode ends with reason "infra" and
    its group is retried on a fresh sandbox, never trained on (`horizon.env.rollouts`)."""


class SandboxResourceError(SandboxError):
    """The policy's commands exceeded a per-sandbox budget (e.g. the disk budget watchdog):
    the policy's doing, so the episode ends with reason "resource" and is trained on (reward 0)."""


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """`read_file` on a path that does not exist in the sandbox (catch either base)."""


class SandboxPermissionError(SandboxError, PermissionError):
    """A file operation the sandbox user may not do ("Permission denied"): the policy's action,
    reported to it like any failed command (catch either base)."""


class SandboxIsADirectoryError(SandboxError, IsADirectoryError):
    """`read_file` / `write_file` on a directory (catch either base)."""


class SandboxArgumentError(SandboxError, ValueError):
    """An argument no sandbox can act on (a path that is empty, relative or holds a NUL byte; a
    command or workdir with a NUL byte), rejected before anything runs (catch either base)."""


def check_path(path: str, what: str = "path") -> str:
    """`path` if it is a usable absolute sandbox path, else `SandboxArgumentError` (one line)."""
    if not isinstance(path, str):
        raise SandboxArgumentError(f"sandbox {what} must be a string, got {type(path).__name__}")
    if not path:
        raise SandboxArgumentError(f"sandbox {what} must not be empty")
    if "\x00" in path:
        raise SandboxArgumentError(f"sandbox {what} must not contain a NUL byte, got {path!r:.200}")
    if not path.startswith("/"):
        raise SandboxArgumentError(f"sandbox paths must be absolute, got {path!r:.200}")
    return path


def check_command(cmd: str) -> str:
    """`cmd` if it can be passed to `bash -c` (a str without NUL bytes), else `SandboxArgumentError`."""
    if not isinstance(cmd, str):
        raise SandboxArgumentError(f"sandbox command must be a string, got {type(cmd).__name__}")
    if "\x00" in cmd:
        raise SandboxArgumentError("sandbox command must not contain a NUL byte")
    return cmd


@dataclasses.dataclass(frozen=True)
class ExecResult:
    exit_code: int          # 124 (or 137) when the command was killed by the timeout
    output: str             # stdout+stderr interleaved, truncated with TRUNCATION_MARKER
    timed_out: bool
    truncated: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class ActionMeter:
    """A sandbox's action count and the wall seconds its actions took (exec, file reads and writes,
    prepare), plus the in-box run time its executor reported where it has one: what a rollout's
    `sandbox_s` split and the per-action overhead are computed from (docs/SANDBOX.md)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.actions = 0
        self.seconds = 0.0
        self.inbox_s = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.actions += 1
            self.seconds += seconds

    def add_inbox(self, seconds: float) -> None:
        """In-box run time the executor reported for one of the actions."""
        with self._lock:
            self.inbox_s += seconds

    def read(self) -> tuple[int, float]:
        """(actions, seconds) so far."""
        with self._lock:
            return self.actions, self.seconds


def meter_of(box) -> ActionMeter:
    """`box`'s meter, made on first use (any object: test doubles get one too)."""
    m = getattr(box, "_action_meter", None)
    if m is None:
        m = ActionMeter()
        try:
            box._action_meter = m
        except AttributeError:   # an object without a __dict__: measured but not kept
            pass
    return m


def metered(fn):
    """Method decorator: the call is one action of `meter_of(self)`, timed on the host."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            meter_of(self).add(time.perf_counter() - t0)

    return wrapper


@runtime_checkable
class Sandbox(Protocol):
    """A stateful, forkable execution environment for one rollout."""

    def exec(self, cmd: str, timeout: float | None = None, workdir: str = WORKSPACE) -> ExecResult:
        """Run `cmd` with bash; kill it (not the sandbox) after `timeout` seconds."""
        ...

    def read_file(self, path: str) -> bytes:
        """Bytes of the file at absolute `path`, read as the sandbox user (symlinks resolved in
        the sandbox). Missing: `SandboxFileNotFoundError`; not readable by the user:
        `SandboxPermissionError`; a directory: `SandboxIsADirectoryError`."""
        ...

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create/overwrite `path` as the sandbox user (missing parent dirs created as that
        user; `mode` applied when the user owns the file). Same errors as `read_file`."""
        ...

    def snapshot(self, tag: str | None = None) -> str:
        """Freeze the filesystem state; returns a snapshot reference usable by `fork`."""
        ...

    def fork(self) -> Sandbox:
        """A new, independent sandbox starting from this one's current filesystem."""
        ...

    def prepare(self, reset: str | None = None, *, workdir: str = WORKSPACE,
                timeout: float | None = None) -> ExecResult | None:
        """Make a pooled sandbox ready for its next episode (call before the task's reset).

        Kills every process of the sandbox user (background servers may live within an
        episode, never across), removes that user's files from the writable scratch places
        outside the workspace (/tmp, /var/tmp, /dev/shm, the user's home) so disk use does
        not accumulate, clears a tripped disk budget, and checks the sandbox can still
        fork/exec a trivial command. Raises `SandboxInfraError` when the sandbox cannot be
        made usable (dead container, a fork bomb that cannot be stopped): replace it.
        The workspace itself is NOT restored: that is the caller's (the task family's reset),
        passed as `reset` (a shell command run as `exec` would, in `workdir`, within
        `timeout`) to run it in the same action; its `ExecResult` is returned (None without one).
        """
        ...

    def alive(self) -> bool:
        """Cheap health check (no exec): the sandbox is open and its container is running."""
        ...

    def close(self) -> None:
        """Destroy the sandbox. Idempotent."""
        ...

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc) -> None: ...
