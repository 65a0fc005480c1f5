"""Shared pytest setup: 8 fake CPU devices (for mesh tests), deterministic f32 math, and the
`sandbox` fixture of the tool and agent tests (real LocalSandbox and, docker-marked, DockerSandbox on
`horizon-sandbox:base`; tests/sandbox overrides it with its own)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import pytest  # noqa: E402

from horizon.sandbox.factory import docker_available, open_sandbox  # noqa: E402

BASE_IMAGE = "horizon-sandbox:base"


def _docker_or_skip():
    if not docker_available():
        pytest.skip("NO DOCKER ENGINE ANSWERS: docker-marked sandbox tests skipped")
    import docker

    try:
        docker.from_env().images.get(BASE_IMAGE)
    except Exception:
        pytest.skip(f"IMAGE {BASE_IMAGE} MISSING: build it with envs/build_base_image.sh")


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    if request.param == "docker":
        _docker_or_skip()
        sb = open_sandbox("docker", BASE_IMAGE)
    else:
        sb = open_sandbox("local")
    yield sb
    sb.close()
