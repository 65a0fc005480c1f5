#!/usr/bin/env python3
"""Build one docker image per task: `horizon-task:<id>` FROM `horizon-sandbox:base` (docs/SPEC.md §5).

Each image is the base plus the task's files/ copied into /workspace (owned by uid 1000),
labelled with the task id, a content hash of its files and the base image id
(`horizon.tasks.env.task_image_labels`). Idempotent: a task whose image already carries
matching labels is skipped. Never pulls (the base image is local; build it first with
envs/build_base_image.sh). Recall tasks are generated on the fly and have no image. A progress
bar with ETA (`horizon.utils.progress`) runs over the images, one line per image above it.

    python envs/build_task_images.py                 # every task under envs/tasks
    python envs/build_task_images.py fix_leap_year   # just these ids
    python envs/build_task_images.py --force         # rebuild even if current
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

import docker
import docker.errors

from horizon.sandbox.base import DEFAULT_BASE_IMAGE
from horizon.tasks.env import task_dockerfile, task_image_labels, task_image_state
from horizon.tasks.loader import default_root, load_tasks
from horizon.tasks.task import Task
from horizon.utils.progress import progress, say


def build_task_image(client: docker.DockerClient, task: Task, base_image: str = DEFAULT_BASE_IMAGE,
                     force: bool = False) -> str:
    """Build (or skip) `task.image`; returns "built" or "skipped"."""
    if task.image is None:
        raise ValueError(f"task {task.id!r} has no image name")
    if not force and task_image_state(task, client, base_image) == "current":
        return "skipped"
    base_id = client.images.get(base_image).id
    labels = task_image_labels(task, base_id)
    with tempfile.TemporaryDirectory(prefix=f"horizon-task-{task.id}-") as ctx:
        ctx_path = pathlib.Path(ctx)
        (ctx_path / "files").mkdir()
        for rel, content in task.files.items():
            p = ctx_path / "files" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content, encoding="utf-8")
        (ctx_path / "Dockerfile").write_text(task_dockerfile(base_image, labels))
        try:
            client.images.build(path=ctx, tag=task.image, pull=False, rm=True, forcerm=True)
        except docker.errors.BuildError as e:
            log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in e.build_log)
            raise RuntimeError(f"building {task.image} failed: {e}\n{log}") from e
    return "built"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("ids", nargs="*", help="task ids (default: all)")
    ap.add_argument("--root", default=None, help="task root (default: envs/tasks)")
    ap.add_argument("--base-image", default=DEFAULT_BASE_IMAGE)
    ap.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    args = ap.parse_args(argv)

    client = docker.from_env(timeout=300)
    try:
        client.images.get(args.base_image)
    except docker.errors.ImageNotFound:
        print(f"base image {args.base_image} not found; run `bash envs/build_base_image.sh` first", file=sys.stderr)
        return 1
    tasks = load_tasks(args.root or default_root())
    if args.ids:
        known = {t.id for t in tasks}
        unknown = sorted(set(args.ids) - known)
        if unknown:
            print(f"unknown task ids: {unknown}", file=sys.stderr)
            return 1
        tasks = [t for t in tasks if t.id in set(args.ids)]
    t0 = time.monotonic()
    counts = {"built": 0, "skipped": 0}
    for i, task in enumerate(progress(tasks, desc="task images", unit="image"), 1):
        t1 = time.monotonic()
        what = build_task_image(client, task, args.base_image, force=args.force)
        counts[what] += 1
        say(f"[build_task_images {i}/{len(tasks)}] {task.image}: {what} ({time.monotonic() - t1:.1f}s)")
    print(f"[build_task_images] done: {counts['built']} built, {counts['skipped']} up to date "
          f"in {time.monotonic() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
