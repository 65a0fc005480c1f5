"""The sandbox protocol every backend implements (SPEC §5).

Tools and the agent loop talk only to this protocol. Paths are absolute paths inside
the sandbox; the task workspace is `WORKSPACE`. Backends: `DockerSandbox` (the real
one, isolated) and `LocalSandbox` (temp dir + subprocess, NOT isolated, a fallback for
laptops without Docker).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

WORKSPACE = "/workspace"
PROJECT_LABEL = "horizon.sandbox"  # label key set on every container/image we create
TRUNCATION_MARKER = "\n[... output truncated: {omitted} bytes omitted ...]\n"


class SandboxError(RuntimeError):
    """A sandbox operation failed (dead container, missing file, engine error)."""


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
