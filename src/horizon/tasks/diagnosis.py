"""Where a SWE-bench episode went wrong (docs/REAL_REPOS.md, "Diagnostics"), read from the final
sandbox and the grader's result: which library files the agent changed (``git diff`` against the
instance's commit; test files and caches left out), whether that is the gold patch's file and the
lines its hunks change (within `NEAR_LINES`), and one failure mode per episode (`MODES`, the first
that applies):

- ``solved``; ``timeout``: the grader's test run timed out;
- ``malformed``: the episode ended on malformed tool calls;
- ``no_edit``: no library file changed; ``wrong_file``: none of the gold patch's files changed;
- ``broke_other_tests``: every FAIL_TO_PASS test passes, some PASS_TO_PASS test does not;
- ``wrong_edit``: the right file, but a FAIL_TO_PASS test still fails.
"""

from __future__ import annotations

import re

from horizon.sandbox.base import WORKSPACE
from horizon.tasks.result import VerifyResult
from horizon.tasks.swebench import REWARD_MODE, patch_hunks
from horizon.tasks.task import Task

MODES = ("solved", "timeout", "malformed", "no_edit", "wrong_file", "broke_other_tests", "wrong_edit")
NEAR_LINES = 3           # an edit this close to a gold hunk's changed lines counts as the right place
UNTRACKED = "@@horizon-untracked@@"
_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_RANGE_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
DIFF_CMD = (f"git diff -U0 --no-color --no-ext-diff HEAD; echo {UNTRACKED}; "
            "git ls-files --others --exclude-standard")


def bug_kind(task: Task) -> str:
    """The task generator's bug kind of an instance (``metadata["generator"]["kind"]``), or "unknown"."""
    return str((task.metadata.get("generator") or {}).get("kind", "unknown"))


def parse_edits(output: str, protected=()) -> dict[str, list[tuple[int, int]]]:
    """`DIFF_CMD`'s output -> {changed file: [(first, last) line changed before the edit]}; a new file
    has no ranges. Files in `protected` (the tests) and what tools leave behind (`_generated`) are
    left out."""
    diff, _, untracked = output.partition(UNTRACKED)
    out: dict[str, list[tuple[int, int]]] = {}
    path = None
    for line in diff.splitlines():
        if m := _FILE_RE.match(line):
            path = m.group(2)
            out.setdefault(path, [])
        elif (m := _RANGE_RE.match(line)) and path is not None:
            a, n = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
            out[path].append((a, a + max(n, 1) - 1))
    for p in untracked.split():
        out.setdefault(p, [])
    keep_out = set(protected)
    return {p: r for p, r in out.items() if p not in keep_out and not _generated(p)}


def _generated(path: str) -> bool:
    """A file tools leave behind, not an edit: caches, hidden tool directories, build metadata."""
    parts = path.split("/")
    return (path.endswith(".pyc") or any(x == "__pycache__" or x.startswith(".") or x.endswith(".egg-info")
                                         for x in parts))


def failure_mode(v: VerifyResult, end_reason: str, edits: dict, gold_files) -> str:
    if v.reward >= 1.0:
        return "solved"
    if v.details.get("timed_out"):
        return "timeout"
    if end_reason == "malformed":
        return "malformed"
    if not edits:
        return "no_edit"
    if not set(edits) & set(gold_files):
        return "wrong_file"
    if v.details.get("f2p_failed", 1) == 0 and v.details.get("p2p_failed", 0) > 0:
        return "broke_other_tests"
    return "wrong_edit"


def diagnose(task: Task, sandbox, v: VerifyResult, end_reason: str) -> dict:
    """The diagnosis fields of one graded episode (module docstring; {} for other task kinds). Raises
    `SandboxInfraError` if the sandbox fails (the caller's infrastructure path)."""
    if task.reward_mode != REWARD_MODE:
        return {}
    r = sandbox.exec(DIFF_CMD, timeout=60.0, workdir=WORKSPACE)
    edits = parse_edits(r.output, task.metadata.get("test_patch_files") or ())
    gold = patch_hunks(str(task.metadata["patch"]))
    gold_files = {h.path for h in gold}

    def near(rng, hunk):
        lo, hi = hunk.changed_lines()
        return rng[0] <= hi + NEAR_LINES and rng[1] >= lo - NEAR_LINES
    right_hunk = any(near(x, h) for h in gold for x in edits.get(h.path, ()))
    return dict(swe_kind=bug_kind(task), swe_mode=failure_mode(v, end_reason, edits, gold_files),
                swe_files_edited=len(edits), swe_right_file=bool(set(edits) & gold_files), swe_right_hunk=right_hunk)
