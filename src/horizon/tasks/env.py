"""Open a sandbox holding a task's initial repository state (docs/SPEC.md §5).

docker: the task image `horizon-task:<id>` (built by envs/build_task_images.py) is used
when it exists and its labels match the task's current files and the current base image;
otherwise the base image `horizon-sandbox:base` is started and the files are written into
/workspace (one tar, extracted as the sandbox user). An imported task whose metadata says
`prepared_image` (a SWE-bench instance image, a built Harbor image) opens its image as is.
local: a `LocalSandbox` (NOT isolated) with the files written in; its commands use the host's
`python3`.
"""

from __future__ import annotations

import io
import tarfile
import time

from horizon.sandbox.base import DEFAULT_BASE_IMAGE, PROJECT_LABEL, WORKSPACE, Sandbox
from horizon.sandbox.docker import get_client
from horizon.sandbox.factory import open_sandbox
from horizon.tasks.task import Task, TaskError, task_hash

TASK_IMAGE_FORMAT = "1"           # bump when the Dockerfile template changes (forces rebuilds)
LABEL_TASK_ID = PROJECT_LABEL + ".task_id"
LABEL_TASK_HASH = PROJECT_LABEL + ".task_hash"
LABEL_TASK_BASE = PROJECT_LABEL + ".task_base"       # id of the base image it was built FROM
LABEL_TASK_FORMAT = PROJECT_LABEL + ".task_format"
_BUNDLE = ".horizon_task_files.tar"
_EXTRACT_TIMEOUT_S = 60.0


def task_dockerfile(base_image: str, labels: dict[str, str]) -> str:
    """Dockerfile for a task image: base + files/ copied into /workspace as uid 1000.

    Two instructions after FROM, because each one costs an intermediate container with the
    classic builder (build-API labels would add one step per label); WORKDIR and USER are
    inherited from the base.
    """
    label_args = " ".join(f'"{k}"="{v}"' for k, v in sorted(labels.items()))
    return f"FROM {base_image}\nCOPY --chown=1000:1000 files/ {WORKSPACE}/\nLABEL {label_args}\n"


def task_image_labels(task: Task, base_image_id: str) -> dict[str, str]:
    return {PROJECT_LABEL: "task-image", LABEL_TASK_ID: task.id, LABEL_TASK_HASH: task_hash(task),
            LABEL_TASK_BASE: base_image_id, LABEL_TASK_FORMAT: TASK_IMAGE_FORMAT}


def task_image_state(task: Task, client=None, base_image: str = DEFAULT_BASE_IMAGE) -> str:
    """"current" (image matches files + base), "stale", "missing", or "no-base"."""
    import docker.errors  # noqa: PLC0415 - docker is only needed for the docker backend

    client = client or get_client()
    try:
        base_id = client.images.get(base_image).id
    except docker.errors.ImageNotFound:
        return "no-base"
    if task.image is None:
        return "missing"
    try:
        image = client.images.get(task.image)
    except docker.errors.ImageNotFound:
        return "missing"
    want = task_image_labels(task, base_id)
    have = image.labels or {}
    return "current" if all(have.get(k) == v for k, v in want.items()) else "stale"


def _bundle(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, content in sorted(files.items()):
            data = content.encode("utf-8")
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_task_files(sandbox: Sandbox, files: dict[str, str]) -> None:
    """Write `files` (relative paths) under /workspace: one tar + extract, else file by file."""
    if len(files) > 1:
        sandbox.write_file(f"{WORKSPACE}/{_BUNDLE}", _bundle(files))
        r = sandbox.exec(f"tar -xf {_BUNDLE} --no-same-owner && rm -f {_BUNDLE}", timeout=_EXTRACT_TIMEOUT_S,
                         workdir=WORKSPACE)
        if r.ok:
            return
        sandbox.exec(f"rm -f {_BUNDLE}", timeout=_EXTRACT_TIMEOUT_S, workdir=WORKSPACE)
    for path, content in files.items():
        sandbox.write_file(f"{WORKSPACE}/{path}", content)


def open_task_sandbox(task: Task, backend: str = "docker", *, base_image: str | None = None,
                      use_task_image: bool = True, **limits) -> Sandbox:
    """A fresh sandbox with `task`'s files in /workspace; `limits` go to `open_sandbox`.

    The returned sandbox records how it was made in `task_source` when the backend allows
    attributes ("image" = baked task image, "files" = files written at start).
    """
    base_image = base_image or DEFAULT_BASE_IMAGE
    if task.metadata.get("prepared_image"):   # imported task: the image IS the initial state
        if backend != "docker":
            raise TaskError(f"task {task.id!r} lives in image {task.image}: it needs the docker backend, "
                            f"not {backend!r}")
        sb = open_sandbox("docker", task.image, **limits)
        _tag(sb, "image")
        return sb
    if backend == "docker" and use_task_image and task.image is not None:
        if task_image_state(task, base_image=base_image) == "current":
            sb = open_sandbox("docker", task.image, **limits)
            _tag(sb, "image")
            return sb
    sb = open_sandbox(backend, base_image if backend == "docker" else None, **limits)
    try:
        write_task_files(sb, task.files)
    except BaseException:
        sb.close()
        raise
    _tag(sb, "files")
    return sb


def _tag(sb, source: str) -> None:
    try:
        sb.task_source = source
    except AttributeError:   # slotted backends: the tag is only informational
        pass
