"""Pick a sandbox backend by name (docs/SPEC.md §5): "docker" (isolated) or "local" (NOT isolated)."""

from __future__ import annotations

import os

from horizon.sandbox.base import Sandbox, SandboxError
from horizon.sandbox.docker import DockerSandbox
from horizon.sandbox.local import LocalSandbox

BACKENDS = ("docker", "local")
_PING_TIMEOUT_S = 5


def docker_available() -> bool:
    """True when the docker SDK is importable and a Docker engine answers a ping."""
    try:
        import docker  # noqa: PLC0415 - optional at import time

        client = docker.from_env(timeout=_PING_TIMEOUT_S)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return False


def open_sandbox(backend: str, image: str | None = None, **limits) -> Sandbox:
    """A new sandbox. `limits` go to `DockerSandbox.create` / `LocalSandbox.create`.

    docker: `image` is an image tag/id (default `HORIZON_BASE_IMAGE`); limits: cpus,
    mem_limit, pids_limit, network, user, labels, default_timeout, max_output_bytes,
    disk_limit_mb (0 = none; the disk budget watchdog), ...
    local:  `image` is ignored unless it is a directory (e.g. a LocalSandbox snapshot),
    which is copied as the root; Docker-only limits (disk_limit_mb too) are accepted and ignored.
    """
    if backend == "docker":
        return DockerSandbox.create(image, **limits)
    if backend == "local":
        template = image if image is not None and os.path.isdir(image) else None
        return LocalSandbox.create(template, **limits)
    raise SandboxError(f"unknown sandbox backend {backend!r}; expected one of {BACKENDS}")
