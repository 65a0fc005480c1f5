"""The sandbox protocol every backend implements (SPEC §5).

Tools and the agent loop talk only to this protocol. Paths are absolute paths inside
the sandbox; the task workspace is `WORKSPACE`. Backends: `DockerSandbox` (the real
one, isolated) and `LocalSandbox` (temp dir + subprocess, NOT isolated, a fallback for
laptops without Docker).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Protocol, runtime_checkable

WORKSPACE = "/workspace"
PROJECT_LABEL = "horizon.sandbox"  # label key set on every container/image we create
TRUNCATION_MARKER = "\n[... output truncated: {omitted} bytes omitted ...]\n"

# Defaults shared by both backends (callers normally pass values from their config).
DEFAULT_BASE_IMAGE = os.environ.get("HORIZON_BASE_IMAGE", "horizon-sandbox:base")
DEFAULT_TIMEOUT_S = 60.0            # per-exec wall-clock limit when `exec(timeout=None)`
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024  # bytes of output kept per exec (head + tail)
KILL_GRACE_S = 2                    # `timeout -k`: SIGKILL this long after SIGTERM
TIMEOUT_EXIT_CODES = (124, 137)     # GNU timeout: 124 after SIGTERM, 137 after SIGKILL


class SandboxError(RuntimeError):
    """A sandbox operation failed (dead container, missing file, engine error)."""


class SandboxInfraError(SandboxError):
    """The sandbox or the engine failed (dead / removed / unusable container, engine error or
    timeout): infrastructure, never the policy's doing (SPEC §4 "infrastructure is not the
    policy"). Tools and the verifier let it propagate; the episode ends with reason "infra" and
    its group is retried on a fresh sandbox, never trained on (`horizon.env.rollouts`)."""


class SandboxResourceError(SandboxError):
    """The policy's commands exceeded a per-sandbox budget (e.g. the disk budget watchdog):
    the policy's doing, so the episode ends with reason "resource" and is trained on (reward 0)."""


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """`read_file` on a path that does not exist in the sandbox (catch either base)."""


class OutputBuffer:
    """Keeps the first and last `max_bytes // 2` bytes of a stream (SPEC §5 output limits).

    Tools show the model the head (the command's start, e.g. a traceback's first frames)
    and the tail (the final error / summary) with a visible `TRUNCATION_MARKER` between.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 2:
            raise ValueError(f"max_output_bytes must be >= 2, got {max_bytes}")
        self.head_cap = max_bytes // 2
        self.tail_cap = max_bytes - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    def result(self) -> tuple[str, bool]:
        """(text, truncated): the kept bytes decoded as UTF-8 (invalid bytes replaced)."""
        omitted = self.total - len(self.head) - len(self.tail)
        if omitted <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace"), False
        text = (bytes(self.head).decode("utf-8", "replace")
                + TRUNCATION_MARKER.format(omitted=omitted)
                + bytes(self.tail).decode("utf-8", "replace"))
        return text, True


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


@runtime_checkable
class Sandbox(Protocol):
    """A stateful, forkable execution environment for one rollout."""

    def exec(self, cmd: str, timeout: float | None = None, workdir: str = WORKSPACE) -> ExecResult:
        """Run `cmd` with bash; kill it (not the sandbox) after `timeout` seconds."""
        ...

    def read_file(self, path: str) -> bytes: ...

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create/overwrite `path` (parent dirs created), owned by the sandbox user."""
        ...

    def snapshot(self, tag: str | None = None) -> str:
        """Freeze the filesystem state; returns a snapshot reference usable by `fork`."""
        ...

    def fork(self) -> "Sandbox":
        """A new, independent sandbox starting from this one's current filesystem."""
        ...

    def close(self) -> None:
        """Destroy the sandbox. Idempotent."""
        ...

    def __enter__(self) -> "Sandbox": ...

    def __exit__(self, *exc) -> None: ...
