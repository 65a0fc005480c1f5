"""horizon.sandbox: stateful, forkable execution environments for rollouts (docs/SPEC.md §5).

    from horizon.sandbox import open_sandbox
    with open_sandbox("docker", "horizon-sandbox:base", default_timeout=30) as sb:
        sb.exec("python3 -c 'print(1)'")

The Docker backend's images: envs/README.md.
"""

from horizon.sandbox.base import (
    DEFAULT_BASE_IMAGE,
    PROJECT_LABEL,
    TRUNCATION_MARKER,
    WORKSPACE,
    ExecResult,
    Sandbox,
    SandboxArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfraError,
    SandboxIsADirectoryError,
    SandboxPermissionError,
    SandboxResourceError,
)
from horizon.sandbox.docker import DockerSandbox, cleanup_leaked
from horizon.sandbox.factory import BACKENDS, docker_available, open_sandbox
from horizon.sandbox.local import LocalSandbox

__all__ = [
    "BACKENDS", "DEFAULT_BASE_IMAGE", "PROJECT_LABEL", "TRUNCATION_MARKER", "WORKSPACE",
    "DockerSandbox", "ExecResult", "LocalSandbox", "Sandbox", "SandboxArgumentError", "SandboxError",
    "SandboxFileNotFoundError", "SandboxInfraError", "SandboxIsADirectoryError", "SandboxPermissionError",
    "SandboxResourceError", "cleanup_leaked", "docker_available", "open_sandbox",
]

