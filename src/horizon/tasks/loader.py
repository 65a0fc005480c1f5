"""Load the in-repo task set from envs/tasks/<id>/ (docs/SPEC.md §5, §7).

Layout of one task directory:

    envs/tasks/<id>/task.json      id, prompt, test_cmd, reward_mode, kind, split,
                                   should_edit, final_answer, metadata (optional: image)
    envs/tasks/<id>/files/...      the initial repository state (copied to /workspace)
    envs/tasks/<id>/solution.json  scripted tool calls [{"name": ..., "args": {...}}, ...]

`get_task("recall_<seed>")` builds a synthetic recall task (`horizon.tasks.recall`).
The default root is `$HORIZON_TASKS_DIR` or the repo's envs/tasks.
"""

from __future__ import annotations

import json
import os
import pathlib

from horizon.tasks.recall import is_recall_id, recall_task_from_id
from horizon.tasks.task import SPLITS, Task, TaskError, task_image_name

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
REQUIRED_KEYS = ("id", "prompt", "test_cmd", "kind", "split")
OPTIONAL_KEYS = ("reward_mode", "should_edit", "final_answer", "metadata", "image")
_SKIP_DIRS = {"__pycache__", ".pytest_cache"}


def default_root() -> pathlib.Path:
    env = os.environ.get("HORIZON_TASKS_DIR")
    return pathlib.Path(env) if env else _REPO_ROOT / "envs" / "tasks"


def _read_files(files_dir: pathlib.Path) -> dict[str, str]:
    out = {}
    for p in sorted(files_dir.rglob("*")):
        rel = p.relative_to(files_dir)
        if any(part in _SKIP_DIRS for part in rel.parts) or p.suffix == ".pyc" or not p.is_file():
            continue
        try:
            out[rel.as_posix()] = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise TaskError(f"{p}: task files must be UTF-8 text ({e})") from e
    return out


def load_task_dir(task_dir: str | os.PathLike) -> Task:
    """Read and validate one task directory; `TaskError` says which file/field is wrong."""
    task_dir = pathlib.Path(task_dir)
    meta_path = task_dir / "task.json"
    if not meta_path.is_file():
        raise TaskError(f"{task_dir}: missing task.json")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TaskError(f"{meta_path}: invalid JSON: {e}") from e
    if not isinstance(meta, dict):
        raise TaskError(f"{meta_path}: must hold a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise TaskError(f"{meta_path}: missing required field(s) {missing}")
    unknown = sorted(set(meta) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise TaskError(f"{meta_path}: unknown field(s) {unknown}; allowed: {REQUIRED_KEYS + OPTIONAL_KEYS}")
    if meta["id"] != task_dir.name:
        raise TaskError(f"{meta_path}: id {meta['id']!r} differs from its directory name {task_dir.name!r}")
    files_dir = task_dir / "files"
    if not files_dir.is_dir():
        raise TaskError(f"{task_dir}: missing files/ directory (the initial repo state)")
    solution: list = []
    sol_path = task_dir / "solution.json"
    if sol_path.is_file():
        try:
            solution = json.loads(sol_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise TaskError(f"{sol_path}: invalid JSON: {e}") from e
        if not isinstance(solution, list):
            raise TaskError(f"{sol_path}: must hold a JSON list of tool calls")
    metadata = dict(meta.get("metadata") or {})
    metadata.setdefault("source", str(task_dir))
    return Task(
        id=meta["id"], prompt=meta["prompt"], files=_read_files(files_dir), test_cmd=meta["test_cmd"],
        reward_mode=meta.get("reward_mode", "binary"), image=meta.get("image", task_image_name(meta["id"])),
        solution=tuple(solution), final_answer=meta.get("final_answer", ""),
        should_edit=meta.get("should_edit", True), kind=meta["kind"], split=meta["split"], metadata=metadata,
    )


def load_tasks(root: str | os.PathLike | None = None, split: str | None = None) -> list[Task]:
    """All tasks under `root` (sorted by id), optionally only one split ("train"/"heldout")."""
    if split is not None and split not in SPLITS:
        raise TaskError(f"split {split!r} is not one of {SPLITS} (or None for all)")
    root = pathlib.Path(root) if root is not None else default_root()
    if not root.is_dir():
        raise TaskError(f"task root {root} is not a directory")
    tasks = [load_task_dir(d) for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith((".", "_"))]
    return [t for t in tasks if split is None or t.split == split]


def get_task(task_id: str, root: str | os.PathLike | None = None) -> Task:
    """The task named `task_id`: a directory under `root`, or a `recall_<seed>...` id."""
    if is_recall_id(task_id):
        return recall_task_from_id(task_id)
    root = pathlib.Path(root) if root is not None else default_root()
    task_dir = root / task_id
    if not (task_dir / "task.json").is_file():
        known = sorted(d.name for d in root.iterdir() if (d / "task.json").is_file()) if root.is_dir() else []
        raise KeyError(f"no task {task_id!r} under {root}; known: {known}")
    return load_task_dir(task_dir)
