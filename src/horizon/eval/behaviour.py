"""Cheap behaviour evals over harness records (docs/SPEC.md §7 "behaviour evals where cheap").

- Tool-format instruction following: malformed-call rate = malformed turns / all turns (the
  agent's `malformed_calls` and `turns` stats), and the fraction of episodes with any.
- Eager edit: on tasks with `should_edit=False` (questions), did the policy change the
  workspace anyway? Detected from the sandbox's final state: files modified, deleted or created
  relative to `task.files` (`horizon.tasks.changed_files`, caches and ANSWER.txt ignored).
- Todo completion: todos completed / todos created, and the fraction of episodes that left
  created todos unfinished (the product penalty of docs/SPEC.md §4).
"""

from __future__ import annotations

from collections.abc import Sequence

from horizon.tasks import changed_files


def eager_edit(task, sandbox) -> list[str]:
    """Workspace files changed versus `task.files` (empty list = no edit). Errors -> ["<error: ...>"]."""
    try:
        return changed_files(task, sandbox)
    except Exception as e:  # noqa: BLE001 - a broken sandbox is reported, not raised
        return [f"<error: {type(e).__name__}: {e}>"]


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else float("nan")


def behaviour_metrics(records: Sequence[dict]) -> dict:
    """Aggregate behaviour metrics from episode records (each with the agent's stats keys, and
    `eager_edit` = True/False on should_edit=False tasks, None elsewhere). NaN = not applicable."""
    if not records:
        raise ValueError("no records")
    for k in ("malformed_calls", "turns", "todos_created", "todos_completed"):
        if any(k not in r for r in records):
            raise KeyError(f"records need the agent stat {k!r}")
    turns = sum(r["turns"] for r in records)
    malformed = sum(r["malformed_calls"] for r in records)
    no_edit = [r for r in records if r.get("eager_edit") is not None]
    created = sum(r["todos_created"] for r in records)
    completed = sum(r["todos_completed"] for r in records)
    with_todos = [r for r in records if r["todos_created"] > 0]
    return {
        "malformed_call_rate": _ratio(malformed, turns),
        "episodes_with_malformed": _ratio(sum(r["malformed_calls"] > 0 for r in records), len(records)),
        "eager_edit_rate": _ratio(sum(bool(r["eager_edit"]) for r in no_edit), len(no_edit)),
        "no_edit_episodes": len(no_edit),
        "todo_completion_rate": _ratio(completed, created),
        "unfinished_todo_episodes": _ratio(sum(r["todos_completed"] < r["todos_created"] for r in with_todos),
                                           len(with_todos)),
        "todos_created": int(created),
    }
