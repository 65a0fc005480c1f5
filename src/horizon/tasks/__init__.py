"""horizon.tasks: the coding-task set, recall-task generator, task sandboxes and verifier (docs/SPEC.md §5, §7).

    from horizon.tasks import load_tasks, open_task_sandbox, verify
    task = load_tasks(split="train")[0]
    with open_task_sandbox(task, backend="docker") as sb:
        ...                                   # the agent acts through horizon.tools
        result = verify(task, sb, final_answer)   # VerifyResult(reward, passed, total, output)
"""

from horizon.tasks.env import open_task_sandbox, task_image_state, write_task_files
from horizon.tasks.loader import default_root, get_task, load_task_dir, load_tasks
from horizon.tasks.recall import (
    HELDOUT_SEED_START,
    filler_volume,
    make_recall_task,
    make_recall_task_for_trigger,
    recall_seeds,
)
from horizon.tasks.result import VerifyResult
from horizon.tasks.task import KINDS, REWARD_MODES, SPLITS, Task, TaskError, task_hash, validate_task
from horizon.tasks.verifier import (
    DEFAULT_VERIFY_TIMEOUT_S,
    answer_matches,
    changed_files,
    normalize_answer,
    parse_pytest_summary,
    verify,
)

__all__ = ["open_task_sandbox", "task_image_state", "write_task_files", "default_root", "get_task", "load_task_dir",
           "load_tasks", "HELDOUT_SEED_START", "filler_volume", "make_recall_task", "make_recall_task_for_trigger",
           "recall_seeds", "KINDS", "REWARD_MODES", "SPLITS", "Task", "TaskError", "task_hash", "validate_task",
           "DEFAULT_VERIFY_TIMEOUT_S", "VerifyResult", "answer_matches", "changed_files", "normalize_answer",
           "parse_pytest_summary", "verify"]
