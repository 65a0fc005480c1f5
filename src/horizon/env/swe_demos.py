"""SFT demonstrations on real repositories from the task generator's gold patches (docs/SPEC.md §6;
docs/REAL_REPOS.md "Demonstrations").

For each instance a scripted engineer's trajectory (`demo_script`): run the test suite up to its
first failure, print the file of each hunk of the gold patch around the failing library frame when
that frame's window holds the hunk, else around the hunk (`read_anchor`; printed by `awk`, so the
lines the edit copies appear in the context exactly as the edit writes them, without `read_file`'s
line numbers), make that hunk's edit with `edit_file` (one ``str_replace`` per hunk: its changed lines,
with more context only where they are not unique in the file as the instance has it,
`edit_strings` and `gold_files`; a patch of several hunks takes several calls), rerun the tests,
finish. It is executed by the real agent loop in the instance's own image through the RL rollout
path (`rollouts.rollout_batch`: the same tools, output truncation, context strategy at the
trigger and verifier), so every observation is real, and a chain is kept only where the verifier
gives it reward 1 (`swebench_demos`). The demonstrator reads the gold patch, not the traceback: the
traceback is in its context because it ran the tests, which is what the policy will learn from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import pathlib
import re
from collections import Counter

import jax
import numpy as np

from horizon.agent.scripted import ScriptedPolicy
from horizon.env.families import Family
from horizon.env.rollouts import SandboxPool, rollout_batch, task_image
from horizon.inference import sampler
from horizon.sandbox.base import WORKSPACE, SandboxError
from horizon.taskgen.repos import is_test_path
from horizon.tasks.diagnosis import bug_kind
from horizon.tasks.swebench import Hunk, patch_files, patch_hunks
from horizon.tasks.task import Task
from horizon.tools.format import SUMMARY_CLOSE, SUMMARY_OPEN, render_call, render_final, tool_format
from horizon.utils.progress import progress

READ_MARGIN = 6          # lines shown before and after a long hunk when the file is printed
READ_RADIUS = 10         # lines shown each side of the printed line
TAIL_LINES = 25          # the end of pytest's output: the failure's short traceback and the summary
EDIT_CONTEXT = 0         # unchanged lines kept on each side of an edit's changed lines (widened until unique)
# The demonstrator's test run: the whole suite, stopping at the first failure (every test but the
# instance's failing ones passes, so that failure is one of them), short tracebacks without the
# warnings summary, the last TAIL_LINES lines, exiting with pytest's status (not tail's). One fixed
# command, before and after the fix: the policy learns it whole instead of copying test ids from
# the prompt, which the tiny model did not learn (docs/REAL_REPOS.md "What the warm start needed").
SUITE_RUN = ("python3 -m pytest -x -q --tb=short -p no:cacheprovider -p no:warnings --color=no 2>&1 "
             f"| tail -n {TAIL_LINES}; exit ${{PIPESTATUS[0]}}")


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


FRAME_RE = re.compile(r"^(\S+\.py):(\d+): in ", re.M)      # a frame of pytest's --tb=short output


def library_frames(output: str) -> list[tuple[str, int]]:
    """(path, line) of the frames of a pytest run's output outside test code (the generator's
    `is_test_path`, so never where it mutates), outermost first."""
    return [(p, int(n)) for p, n in FRAME_RE.findall(output) if not is_test_path(p)]


def read_anchor(h: Hunk, frames: list[tuple[str, int]]) -> tuple[int, int, bool]:
    """(centre line, radius, from a frame) of the print before hunk `h`'s edit: the deepest library
    frame of the failing run (`library_frames`) in the hunk's file whose window of READ_RADIUS lines
    each side holds the hunk (its line is in the context, so the policy can copy it), else the hunk's
    middle line (the demonstrator knows it from the gold patch); the radius grows to fit a long hunk."""
    n = h.old.count("\n") + 1
    for path, line in reversed(frames):
        if path == h.path and line - READ_RADIUS <= h.new_start and h.new_start + n - 1 <= line + READ_RADIUS:
            return line, READ_RADIUS, True
    return h.new_start + (n - 1) // 2, max(READ_RADIUS, n // 2 + READ_MARGIN), False


def print_command(path: str, centre: int, radius: int) -> str:
    """The file's lines within `radius` of `centre`, as they are (no numbers: module docstring). The
    line is written once per bound and never computed with, so a copied line number is the whole call."""
    return f"awk 'NR>={centre}-{radius} && NR<={centre}+{radius}' {path}"


def demo_script(task: Task, files: dict[str, str] | None = None,
                frames: list[tuple[str, int]] | None = None) -> list[tuple[str, str]]:
    """(thought, turn text) of the engineer's trajectory for a generated instance (module docstring);
    `files`: the gold patch's files as the instance has them (path -> text), for unique edits;
    `frames`: the library frames of the instance's failing run (`library_frames`), where to look."""
    files = dict(files or {})
    hunks = patch_hunks(str(task.metadata["patch"]))
    if not hunks:
        raise ValueError(f"{task.id}: the gold patch has no hunks")
    run = render_call("run_shell", {"command": SUITE_RUN})
    turns = [("Run the tests to see what fails.", run)]
    for h in hunks:
        path = f"{WORKSPACE}/{h.path}"
        centre, radius, _ = read_anchor(h, list(frames or ()))
        turns.append((f"The failure comes from {h.path}; print it around line {centre}.",
                      render_call("run_shell", {"command": print_command(path, centre, radius)})))
        old_str, new_str = edit_strings(h, files.get(h.path))
        if h.path in files:                                   # the next hunk sees this one applied
            files[h.path] = files[h.path].replace(old_str, new_str, 1)
        turns.append((f"Fix the code at {h.path}:{h.new_start}.",
                      render_call("edit_file", {"command": "str_replace", "path": path, "old_str": old_str,
                                                "new_str": new_str})))
    turns.append(("Run the tests again to check the fix.", run))
    turns.append(("The tests pass now.",
                  render_final(f"Fixed {', '.join(sorted({h.path for h in hunks}))}: the tests pass.")))
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


def first_look(sandbox, task: Task, timeout: float) -> tuple[dict[str, str], list[tuple[str, int]]]:
    """What the demonstrator knows before it acts: `gold_files` and the library frames of the suite
    run it will make first (`SUITE_RUN`, run here once with the agent's tool `timeout`; no frames if
    the run fails to start)."""
    try:
        frames = library_frames(sandbox.exec(SUITE_RUN, timeout=timeout).output)
    except SandboxError:
        frames = []
    return gold_files(sandbox, task), frames


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
    reads: int = 0                # file prints in kept chains (one per hunk)
    frame_reads: int = 0          # of which around a failing library frame (`read_anchor`)
    rows: int = 0                 # SFT rows (one per segment)
    tokens: int = 0               # trained tokens

    def record(self) -> dict:
        """Flat numbers for the run's metrics log."""
        return {"demos/tried": self.tried, "demos/kept": self.kept, "demos/unsolved": len(self.unsolved),
                "demos/infra": len(self.infra), "demos/summaries": self.summaries, "demos/rows": self.rows,
                "demos/reads": self.reads, "demos/frame_reads": self.frame_reads,
                "demos/tokens": self.tokens, **{f"demos/kept_{k}": v for k, v in sorted(self.kinds_kept.items())}}

    def line(self) -> str:
        dropped = "".join(f"; {name}: {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''}"
                          for name, ids in (("unsolved", self.unsolved), ("sandbox failed", self.infra)) if ids)
        return (f"{self.kept}/{self.tried} demos kept ({len(self.unsolved)} unsolved, {len(self.infra)} sandbox "
                f"failures); {self.rows} rows, {self.tokens} trained tokens, {self.summaries} summaries, "
                f"{self.frame_reads} of {self.reads} prints at a failing frame; kept by "
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
        seen = pool.map(lambda j, t: first_look(pool.ready(j, family.reset_step(t), task_image(family, t), task=t),
                                                t, float(c.agent.tool_timeout_s)), range(len(chunk)), chunk)
        policy = ScriptedPolicy({t.prompt: demo_script(t, f, fr) for t, (f, fr) in zip(chunk, seen)}, tok)
        trajs, _, infos = rollout_batch(family, chunk, policy, pool, c, tok)
        for t, (_, fr), tr, info in zip(chunk, seen, trajs, infos):
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
                anchors = [read_anchor(h, fr)[2] for h in patch_hunks(str(t.metadata["patch"]))]
                report.reads += len(anchors)
                report.frame_reads += sum(anchors)
                report.rows += len(segs)
                report.tokens += int(sum(int(m.sum()) for _, m in segs))
            bar.update(1)
    bar.close()
    return rows, report


def demo_key(tasks, c) -> str:
    """The fingerprint of a set of demonstrations: the instances (id, prompt, image, gold patch,
    tests), the agent's settings, the tokenizer and the demonstrator itself (the source of the
    functions that write its turns, and their constants), i.e. everything a built row depends on."""
    h = hashlib.sha256()
    for f in (demo_script, read_anchor, print_command, edit_strings, library_frames):
        h.update(inspect.getsource(f).encode())
    h.update(json.dumps([SUITE_RUN, READ_MARGIN, READ_RADIUS, EDIT_CONTEXT, FRAME_RE.pattern]).encode())
    for t in tasks:
        m = t.metadata
        h.update(json.dumps([t.id, t.prompt, t.image, str(m.get("patch", "")),
                             list(m.get("fail_to_pass", ()))]).encode())
    h.update(json.dumps([c.agent.to_dict(), str(c.model.tokenizer), int(c.model.vocab_size)], sort_keys=True,
                        default=str).encode())
    return h.hexdigest()


def save_rows(path, rows, key: str, report: DemoReport) -> None:
    """Write demonstration rows [(tokens, loss_mask)] to `path` (.npz) under `key` (`demo_key`),
    with the report's numbers, so a rerun with other SFT settings does not rebuild them."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = np.array([len(t) for t, _ in rows], np.int64)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, tokens=np.concatenate([np.asarray(t, np.int32) for t, _ in rows]),
             masks=np.concatenate([np.asarray(m, np.float32) for _, m in rows]), lengths=lengths,
             key=np.array(key), report=np.array(json.dumps(report.record())))
    tmp.replace(path)


def load_rows(path, key: str) -> tuple[list, dict] | None:
    """(rows, the report's numbers) saved by `save_rows` under `key`; None if `path` is missing or
    holds another set's rows."""
    path = pathlib.Path(path)
    if not path.exists():
        return None
    with np.load(path) as z:
        if str(z["key"]) != key:
            return None
        cut = np.cumsum(z["lengths"])[:-1]
        rows = list(zip(np.split(z["tokens"], cut), np.split(z["masks"], cut)))
        return rows, json.loads(str(z["report"]))


def turn_kind(fmt, text: str) -> str:
    """What an assistant turn is: ``call:<tool>``, ``final``, ``summary`` (a closed summary block)
    or ``malformed``."""
    a, b = text.find(SUMMARY_OPEN), text.rfind(SUMMARY_CLOSE)
    if 0 <= a < b:
        return "summary"
    act = fmt.parse_action(text)
    kind = getattr(act, "kind", "")
    return f"call:{act.name}" if kind == "call" else (kind or "malformed")


def agent_turns(rows, limit: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(context, turn) token arrays of the first `limit` assistant turns of demonstration `rows`
    [(tokens, loss_mask)]: each run of loss-mask 1 and every token before it in its row."""
    out = []
    for toks, mask in rows:
        m = np.asarray(mask) > 0
        edges = np.flatnonzero(np.diff(np.concatenate([[0], m.astype(np.int8), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):
            out.append((np.asarray(toks[:a]), np.asarray(toks[a:b])))
            if len(out) == limit:
                return out
    return out


def turn_probe(params, turns, c, tok, *, batch: int = 16, temperature: float = 0.0) -> dict:
    """The SFT gate without a sandbox: decodes of each (context, turn) of `agent_turns` (contexts of
    demonstrations the policy was not trained on, every observation real) at `temperature` (0:
    greedy), each up to its turn's length plus 16 tokens within `model.max_seq_len`. Returns the
    fractions of decodes that are well-formed (`turn_kind` not malformed), of the demonstrated kind
    (same tool, final or summary), and identical to the demonstration; over the demonstrated edits,
    the fractions well-formed and whose ``old_str`` is the demonstration's (the copy is right)."""
    fmt, cap = tool_format(str(c.agent.tool_format)), int(c.model.max_seq_len)
    order = sorted(range(len(turns)), key=lambda i: len(turns[i][0]))
    sc = sampler.sampler_config(c, temperature=float(temperature))
    got = [""] * len(turns)
    for lo in range(0, len(order), batch):
        idx = order[lo:lo + batch]
        longest = max(len(turns[i][0]) for i in idx)
        new = min(cap - longest, max(len(turns[i][1]) for i in idx) + 16)
        gen = sampler.generate(params, [turns[i][0] for i in idx], jax.random.PRNGKey(lo), cfg=c,
                               max_new_tokens=new, sampling=sc).tokens
        for i, g in zip(idx, gen):
            got[i] = tok.decode(list(g))
    want = [tok.decode(list(t)) for _, t in turns]
    kinds = [(turn_kind(fmt, g), turn_kind(fmt, w)) for g, w in zip(got, want)]
    out = dict(turn_wellformed=float(np.mean([k != "malformed" for k, _ in kinds])),
               turn_same_kind=float(np.mean([k == w for k, w in kinds])),
               turn_exact=float(np.mean([g.strip() == w.strip() for g, w in zip(got, want)])))
    edits = [i for i, (_, w) in enumerate(kinds) if w == "call:edit_file"]   # the calls that copy the most
    if edits:
        out.update(edit_wellformed=float(np.mean([kinds[i][0] != "malformed" for i in edits])),
                   edit_old_exact=float(np.mean([_arg(fmt, got[i], "old_str") == _arg(fmt, want[i], "old_str")
                                                 for i in edits])))
    return out


def _arg(fmt, text: str, key: str) -> str | None:
    """A call's raw argument `key` (None when the turn is not a call that has it)."""
    act = fmt.parse_action(text)
    return act.args.get(key) if getattr(act, "kind", "") == "call" else None
