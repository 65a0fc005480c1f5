"""The `Task` record: one coding problem for rollouts and evaluation (docs/SPEC.md §5, §7).

A task is an initial repository state (`files`, written under /workspace), a user prompt,
and a way to score the final sandbox state:

- reward_mode "binary":   1.0 iff `test_cmd` exits 0 with no failed/errored tests;
- reward_mode "fraction": passed / (passed + failed + errors) from pytest's summary line;
- reward_mode "answer":   the final answer (plus /workspace/ANSWER.txt, if written) must
  contain the expected strings in `metadata["expected"]` (question and recall tasks; see
  `horizon.tasks.verifier`).
- reward_mode "swebench": an imported SWE-bench instance, graded per test (`horizon.tasks.swebench`);
- reward_mode "harbor":   an imported Harbor task, graded by its tests/test.sh (`horizon.tasks.harbor`).

The interface is fixed by docs/SPEC.md §5; `validate_task` runs on
construction so a malformed task fails loudly where it is made, not mid-rollout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import re

REWARD_MODES = ("binary", "fraction", "answer", "swebench", "harbor")   # the last two: imported task sets
KINDS = ("bugfix", "feature", "tests", "config", "refactor", "question", "recall")
SPLITS = ("train", "heldout")
TASK_IMAGE_REPO = "horizon-task"          # task images are tagged horizon-task:<id>
_ID_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,127}")   # valid as a docker tag


class TaskError(ValueError):
    """A task definition is malformed (missing field, bad value, bad file path)."""


@dataclasses.dataclass(frozen=True)
class Task:
    id: str                      # e.g. "fix_off_by_one_pagination"
    prompt: str                  # the user's request, short and under-specified
    files: dict[str, str]        # path relative to /workspace -> content: the initial repo state
    test_cmd: str                # run in /workspace by the verifier ("" allowed for reward_mode "answer")
    reward_mode: str = "binary"  # "binary" | "fraction" | "answer"
    image: str | None = None     # docker image with files baked in; None -> base image + write files
    solution: tuple[dict, ...] = ()  # scripted tool calls that solve it
    final_answer: str = ""       # what a scripted policy says at the end
    should_edit: bool = True     # False for answer-only tasks (eager-edit eval)
    kind: str = "bugfix"         # one of KINDS
    split: str = "train"         # "train" | "heldout"
    metadata: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        validate_task(self)


def task_image_name(task_id: str) -> str:
    return f"{TASK_IMAGE_REPO}:{task_id}"


def _where(task) -> str:
    src = task.metadata.get("source") if isinstance(task.metadata, dict) else None
    return f"task {task.id!r}" + (f" ({src})" if src else "")


def validate_file_path(path: str) -> str | None:
    """Why `path` is not a valid workspace-relative file path, or None if it is."""
    if not isinstance(path, str) or not path:
        return "file paths must be non-empty strings"
    if path.startswith("/") or "\\" in path:
        return f"file path {path!r} must be relative to /workspace (posix, no leading '/')"
    norm = posixpath.normpath(path)
    if norm != path or norm == "." or norm.startswith("../") or norm == "..":
        return f"file path {path!r} is not normalised or escapes /workspace"
    return None


def _check_expected(expected) -> str | None:
    if not isinstance(expected, list) or not expected:
        return 'metadata["expected"] must be a non-empty list of groups (lists of acceptable strings)'
    for group in expected:
        if not isinstance(group, list) or not group or not all(isinstance(s, str) and s.strip() for s in group):
            return f'metadata["expected"] group {group!r} must be a non-empty list of non-empty strings'
    return None


def validate_task(task: Task) -> None:
    """Raise `TaskError` naming the task and the problem if `task` is malformed."""
    if not isinstance(task.id, str) or not _ID_RE.fullmatch(task.id):
        raise TaskError(f"task id {task.id!r} must match {_ID_RE.pattern} (lowercase, usable as a docker tag)")
    where = _where(task)
    errors = []
    if not isinstance(task.prompt, str) or not task.prompt.strip():
        errors.append("prompt must be a non-empty string")
    if not isinstance(task.files, dict):
        errors.append(f"files must be a dict path -> content, got {type(task.files).__name__}")
    else:
        for path, content in task.files.items():
            why = validate_file_path(path)
            if why:
                errors.append(why)
            if not isinstance(content, str):
                errors.append(f"content of {path!r} must be str, got {type(content).__name__}")
    if task.reward_mode not in REWARD_MODES:
        errors.append(f"reward_mode {task.reward_mode!r} is not one of {REWARD_MODES}")
    if not isinstance(task.test_cmd, str):
        errors.append("test_cmd must be a string")
    elif task.reward_mode != "answer" and not task.test_cmd.strip():
        errors.append(f"test_cmd is required for reward_mode {task.reward_mode!r}")
    if task.kind not in KINDS:
        errors.append(f"kind {task.kind!r} is not one of {KINDS}")
    if task.split not in SPLITS:
        errors.append(f"split {task.split!r} is not one of {SPLITS}")
    if not isinstance(task.should_edit, bool):
        errors.append("should_edit must be a bool")
    elif not task.should_edit and task.reward_mode != "answer":
        errors.append('should_edit=False tasks are scored on the answer: reward_mode must be "answer"')
    if not isinstance(task.final_answer, str):
        errors.append("final_answer must be a string")
    if task.image is not None and (not isinstance(task.image, str) or not task.image):
        errors.append("image must be None or a non-empty image reference")
    if not isinstance(task.metadata, dict):
        errors.append("metadata must be a dict")
    elif task.reward_mode == "answer":
        why = _check_expected(task.metadata.get("expected"))
        if why:
            errors.append(why)
    if not isinstance(task.solution, tuple):
        errors.append("solution must be a tuple of tool calls")
    else:
        for i, call in enumerate(task.solution):
            if (not isinstance(call, dict) or not isinstance(call.get("name"), str)
                    or not isinstance(call.get("args", {}), dict) or set(call) - {"name", "args"}):
                errors.append(f'solution[{i}] must be {{"name": str, "args": dict}}, got {call!r}')
    if errors:
        raise TaskError(f"{where}: " + "; ".join(errors))


def task_hash(task: Task) -> str:
    """Content hash of what a task image bakes in (id + files); sha256 hex (docs/SPEC.md §5)."""
    h = hashlib.sha256()
    h.update(json.dumps({"id": task.id, "files": sorted(task.files.items())}, ensure_ascii=False).encode())
    return h.hexdigest()
