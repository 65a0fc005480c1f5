"""Sandbox test fixtures: a `sandbox` parametrized over both backends (docs/SPEC.md §5).

Docker cases are marked `docker` and skip loudly only when no engine answers; they build
the base image with envs/build_base_image.sh (idempotent) if it is missing.
"""

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from horizon.sandbox import DEFAULT_BASE_IMAGE, docker_available, open_sandbox

REPO = Path(__file__).resolve().parents[2]
TEST_LABEL = "horizon.test_run"
RUN_ID = uuid.uuid4().hex[:10]   # labels everything this test run creates
MAX_OUTPUT = 1000                # small cap so truncation is cheap to trigger
DEFAULT_TIMEOUT = 30.0

NO_DOCKER = ("\n\n*** DOCKER ENGINE NOT AVAILABLE: Docker sandbox tests SKIPPED. The isolation "
             "guarantees of docs/SPEC.md §5 are NOT being tested. ***\n")


@pytest.fixture(scope="session")
def docker_image():
    if not docker_available():
        pytest.skip(NO_DOCKER)
    import docker

    client = docker.from_env()
    try:
        client.images.get(DEFAULT_BASE_IMAGE)
    except docker.errors.ImageNotFound:
        subprocess.run(["bash", str(REPO / "envs" / "build_base_image.sh")], check=True,
                       env={**os.environ, "HORIZON_BASE_IMAGE": DEFAULT_BASE_IMAGE})
    yield DEFAULT_BASE_IMAGE
    from horizon.sandbox.docker import cleanup_leaked

    cleanup_leaked(labels={TEST_LABEL: RUN_ID})   # nothing of this run may outlive it


BACKEND_PARAMS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request):
    if request.param == "docker":
        request.getfixturevalue("docker_image")
    return request.param


def make_sandbox(backend, **limits):
    limits = {"default_timeout": DEFAULT_TIMEOUT, "max_output_bytes": MAX_OUTPUT, **limits}
    if backend == "docker":
        limits.setdefault("labels", {TEST_LABEL: RUN_ID})
        return open_sandbox("docker", DEFAULT_BASE_IMAGE, **limits)
    return open_sandbox("local", None, **limits)


@pytest.fixture
def make(backend):
    """Factory for extra sandboxes of the current backend (closed by the test or at teardown)."""
    made = []

    def _make(**limits):
        made.append(make_sandbox(backend, **limits))
        return made[-1]

    yield _make
    for sb in made:
        sb.close()


@pytest.fixture
def sandbox(backend):
    sb = make_sandbox(backend)
    yield sb
    sb.close()


@pytest.fixture
def docker_make(docker_image):
    """Factory for Docker sandboxes labelled with this test run (closed at teardown)."""
    made = []

    def _make(**limits):
        made.append(make_sandbox("docker", **limits))
        return made[-1]

    yield _make
    for sb in made:
        sb.close()


@pytest.fixture
def run_label():
    return {TEST_LABEL: RUN_ID}
