"""SFT demonstrations on real repositories from the task generator's gold patches (docs/SPEC.md §6;
docs/REAL_REPOS.md "Demonstrations").

For each instance a scripted engineer's trajectory (`demo_script`): run the failing tests, open
the file of each hunk of the gold patch around it, make that hunk's edit with `edit_file`
(one ``str_replace`` per hunk: its changed lines with one line of context, more where that is
not unique in the file as the instance has it, `edit_strings` and `gold_files`; a patch of several
hunks takes several calls), rerun the tests,
finish. It is executed by the real agent loop in the instance's own image through the RL rollout
path (`rollouts.rollout_batch`: the same tools, output truncation, context strategy at the
trigger and verifier), so every observation is real, and a chain is kept only where the verifier
gives it reward 1 (`swebench_demos`). The demonstrator reads the gold patch, not the traceback: the
traceback is in its context because it ran the tests, which is what the policy will learn from.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections import Counter

from horizon.agent.scripted import ScriptedPolicy
from horizon.env.families import Family
from horizon.env.rollouts import SandboxPool, rollout_batch, task_image
from horizon.sandbox.base import WORKSPACE, SandboxError
from horizon.tasks.diagnosis import bug_kind
from horizon.tasks.swebench import Hunk, patch_files, patch_hunks
from horizon.tasks.task import Task
from horizon.tools.format import render_call, render_final
from horizon.utils.progress import progress

MAX_TESTS = 4            # failing tests the demonstrator runs (the problem statement lists up to 8)
READ_MARGIN = 6          # lines shown before and after a hunk when the file is opened
TAIL_LINES = 25          # the end of pytest's output: the short summary and the last traceback
EDIT_CONTEXT = 1         # unchanged lines kept on each side of an edit's changed lines


def pytest_run(tests) -> str:
    """The demonstrator's pytest run of `tests` (ids), quiet, its last `TAIL_LINES` lines, exiting
    with pytest's status (not tail's)."""
    ids = " ".join(shlex.quote(t) for t in tests)
    return (f"python3 -m pytest -q -p no:cacheprovider --color=no {ids} 2>&1 | tail -n {TAIL_LINES}; "
            "exit ${PIPESTATUS[0]}")


def edit_strings(h: Hunk, text: str | None = None, context: int = EDIT_CONTEXT) -> tuple[str, str]:
    """(old_str, new_str) of a hunk's edit: its changed lines with `context` unchanged lines on each
    side (one more for a pure insertion), widened up to the diff's own context until old_str occurs
    once in the file's current `text` (when given), so the call stays short and `str_replace`
    accepts it. A hunk that is never unique makes its edit fail, and the chain is dropped."""
    a, b = h.old.split("\n"), h.new.split("\n")
    pre, suf = h.context()
    keep = context + (len(a) - pre - suf == 0)
    while True:
        lo, hi_a, hi_b = max(0, pre - keep), len(a) - max(0, suf - keep), len(b) - max(0, suf - keep)
        old, new = "\n".join(a[lo:hi_a]), "\n".join(b[lo:hi_b])
        if text is None or text.count(old) <= 1 or (lo == 0 and hi_a == len(a)):
            return old, new
        keep += 1


def demo_script(task: Task, files: dict[str, str] | None = None, *, max_tests: int = MAX_TESTS
                ) -> list[tuple[str, str]]:
    """(thought, turn text) of the engineer's trajectory for a generated instance (module docstring);
    `files`: the gold patch's files as the instance has them (path -> text), for unique edits."""
    files = dict(files or {})
    hunks = patch_hunks(str(task.metadata["patch"]))
    if not hunks:
        raise ValueError(f"{task.id}: the gold patch has no hunks")
    tests = list(task.metadata["fail_to_pass"])[:max_tests]
    run = render_call("run_shell", {"command": pytest_run(tests)})
    turns = [("Run the failing tests to see the error.", run)]
    for h in hunks:
        path = f"{WORKSPACE}/{h.path}"
        n_lines = h.old.count("\n") + 1
        lo, hi = max(1, h.new_start - READ_MARGIN), h.new_start + n_lines - 1 + READ_MARGIN
        turns.append((f"The failure comes from {h.path}; open it around line {h.new_start}.",
                      render_call("read_file", {"path": path, "start_line": lo, "end_line": hi})))
        old_str, new_str = edit_strings(h, files.get(h.path))
        if h.path in files:                                   # the next hunk sees this one applied
            files[h.path] = files[h.path].replace(old_str, new_str, 1)
        turns.append((f"Fix the code at {h.path}:{h.new_start}.",
                      render_call("edit_file", {"command": "str_replace", "path": path, "old_str": old_str,
                                                "new_str": new_str})))
    turns.append(("Run the tests again to check the fix.", run))
    turns.append(("The failing tests pass now.",
                  render_final(f"Fixed {', '.join(sorted({h.path for h in hunks}))}: the failing tests pass.")))
    return turns


def gold_files(sandbox, task: Task) -> dict[str, str]:
    """The gold patch's files as the instance's sandbox has them (a file that cannot be read is left
    out: its edits keep the short context)."""
    out = {}
    for path in patch_files(str(task.metadata["patch"])):
        try:
            out[path] = sandbox.read_file(f"{WORKSPACE}/{path}").decode("utf-8", errors="replace")
        except SandboxError:
            continue
    return out


@dataclasses.dataclass
class DemoReport:
    """What the builder kept and why it dropped the rest (counts by the generator's bug kind)."""
    tried: int = 0
    kept: int = 0
    unsolved: list = dataclasses.field(default_factory=list)     # task ids the verifier did not give 1
    infra: list = dataclasses.field(default_factory=list)        # task ids whose sandbox failed
    kinds_tried: Counter = dataclasses.field(default_factory=Counter)
    kinds_kept: Counter = dataclasses.field(default_factory=Counter)
    summaries: int = 0            # summaries written in kept chains (the context strategy at the trigger)
    rows: int = 0                 # SFT rows (one per segment)
    tokens: int = 0               # trained tokens

    def record(self) -> dict:
        """Flat numbers for the run's metrics log."""
        return {"demos/tried": self.tried, "demos/kept": self.kept, "demos/unsolved": len(self.unsolved),
                "demos/infra": len(self.infra), "demos/summaries": self.summaries, "demos/rows": self.rows,
                "demos/tokens": self.tokens, **{f"demos/kept_{k}": v for k, v in sorted(self.kinds_kept.items())}}

    def line(self) -> str:
        dropped = "".join(f"; {name}: {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''}"
                          for name, ids in (("unsolved", self.unsolved), ("sandbox failed", self.infra)) if ids)
        return (f"{self.kept}/{self.tried} demos kept ({len(self.unsolved)} unsolved, {len(self.infra)} sandbox "
                f"failures); {self.rows} rows, {self.tokens} trained tokens, {self.summaries} summaries; kept by "
                f"kind {dict(sorted(self.kinds_kept.items()))} of {dict(sorted(self.kinds_tried.items()))}{dropped}")


def prompt_chunks(tasks, n: int) -> list[list[Task]]:
    """`tasks` in order, in chunks of at most `n` whose prompts differ (`ScriptedPolicy` finds a
    script by its task's prompt, and two instances can fail the same tests alike)."""
    chunks: list[list[Task]] = []
    for t in tasks:
        home = next((ch for ch in chunks if len(ch) < n and all(x.prompt != t.prompt for x in ch)), None)
        if home is None:
            chunks.append(home := [])
        home.append(t)
    return chunks


def swebench_demos(family: Family, tasks, pool: SandboxPool, c, tok) -> tuple[list, DemoReport]:
    """(SFT rows (tokens, loss_mask), report) of `demo_script` run on `tasks` in `pool`'s boxes
    through `rollout_batch` (module docstring), `len(pool.boxes)` episodes at a time."""
    report = DemoReport()
    rows = []
    bar = progress(total=len(tasks), desc="swe demos", unit="demo")
    for chunk in prompt_chunks(tasks, len(pool.boxes)):
        texts = pool.map(lambda j, t: gold_files(pool.ready(j, family.reset_step(t), task_image(family, t), task=t),
                                                 t), range(len(chunk)), chunk)
        policy = ScriptedPolicy({t.prompt: demo_script(t, f) for t, f in zip(chunk, texts)}, tok)
        trajs, _, infos = rollout_batch(family, chunk, policy, pool, c, tok)
        for t, tr, info in zip(chunk, trajs, infos):
            report.tried += 1
            report.kinds_tried[bug_kind(t)] += 1
            if info.get("infra"):
                report.infra.append(t.id)
            elif float(info.get("verifier", 0.0)) < 1.0:
                report.unsolved.append(t.id)
            else:
                segs = [(s.tokens, s.loss_mask) for s in tr.segments if s.loss_mask.any()]
                rows += segs
                report.kept += 1
                report.kinds_kept[bug_kind(t)] += 1
                report.summaries += int(tr.stats.get("summaries", 0))
                report.rows += len(segs)
                report.tokens += int(sum(int(m.sum()) for _, m in segs))
            bar.update(1)
    bar.close()
    return rows, report
