"""Sandboxes for tool tests: the real LocalSandbox, and DockerSandbox on `horizon-sandbox:base` (docker-marked)."""

import pytest

from horizon.sandbox.factory import docker_available, open_sandbox

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
