"""Procedurally generated one-edit config tasks: a learnable RL environment family (docs/SPEC.md §4, §7).

A tiny byte-level model cannot solve the hand-written task set from scratch, so the RL
demo (experiments/rl.py) trains on a *family* of tasks that differ only in their values:

    prompt:  "In settings.py set TIMEOUT to 17."      (the file has TIMEOUT = 42)
    files:   settings.py with 2-4 integer constants, TIMEOUT = 42 among them
    test:    python3 -B -c '...'  (exit 0 iff TIMEOUT == 17 and every other constant is unchanged)

The one-call solution uses the environment's own compact tool (docs/SPEC.md §5: per-environment
tool sets), `set(name, value)`, executed in the sandbox by one `sed -i` exec; the call
`<function=set><parameter=value>17</parameter><parameter=name>TIMEOUT</parameter></function>`
is ~100 bytes, so success needs exact copying of the constant name and the digits: a model
that learned the call format but copies unreliably scores partial reward, which is the
headroom RL has to close. `edit_solution(task)` + `synthetic_registry(tool="edit_file")`
give the same edit as one built-in `edit_file` str_replace (a ~200-byte call that the tiny
model did not learn in a short SFT). Held-out tasks are *unseen seeds of the
same family* (seed >= `HELDOUT_SEED_START`), so held-out reward measures generalisation
of the copying skill, not memorised prompts.

Everything is deterministic in the seed (`make_synthetic_task(seed)`; ids
`synth_<seed>`, rebuilt with `synthetic_task_from_id`). `reset_command(task)` returns one
shell command that wipes /workspace and writes the task's files, so a pooled sandbox can
be reused for the next episode with a single exec (the RL driver's sandbox pool).
The test uses `python3 -B` (no .pyc): a pooled sandbox may rewrite the same file with the
same size within one second, and a stale bytecode cache would otherwise be imported.
"""

from __future__ import annotations

import posixpath
import random
import re
import shlex

from horizon.tasks.task import Task
from horizon.tools.builtin import BUILTIN_TOOLS
from horizon.tools.registry import Param, Tool, ToolArgError, ToolContext, ToolRegistry

HELDOUT_SEED_START = 1_000_000
WORKSPACE = "/workspace"
MODULES = ("settings", "config", "app", "limits", "defaults", "server", "worker", "client")
PREFIXES = ("MAX", "MIN", "DEFAULT", "CACHE", "RETRY", "HTTP", "DB", "LOG", "POOL", "QUEUE", "BATCH", "API")
SUFFIXES = ("TIMEOUT", "SIZE", "LIMIT", "COUNT", "PORT", "DELAY", "WORKERS", "RETRIES", "DEPTH", "TTL")
# `name_style="simple"`: one word per constant, distinct first letters, so naming the target is a
# one-byte lookup in the prompt (then completion from memory) instead of a 10-14 byte copy.
SIMPLE_NAMES = ("TIMEOUT", "SIZE", "LIMIT", "COUNT", "PORT", "WORKERS", "RETRIES", "DEPTH", "BATCH", "QUEUE")
NAME_STYLES = ("compound", "simple")
_ID_RE = re.compile(r"synth_(\d+)")
# Only the NEW value is in the prompt (the one number in the context): copying it is a content
# lookup ("the digits"); with "change X from 42 to 17" a tiny model did not learn which of the
# two numbers to copy within 400 SFT steps.
PROMPT_TEMPLATE = "In {module}.py set {name} to {new}."
CONST_RE = re.compile(r"[A-Z][A-Z0-9_]*\Z")
INT_RE = re.compile(r"-?[0-9]{1,9}\Z")
# The environment's system prompt (replaces the generic tool-spec prompt, ~1.1 KB, so a context
# is ~90 bytes): the tiny policy learns the call format from the SFT demonstrations.
SYSTEM_PROMPT = "Tool: set(value, name)."
# The same for the edit_file variant of the environment (`synthetic_registry(tool="edit_file")`).
EDIT_SYSTEM_PROMPT = "Tools: edit_file(command=str_replace, path, old_str, new_str). Paths are absolute."


def synthetic_split(seed: int, heldout_seed_start: int = HELDOUT_SEED_START) -> str:
    return "heldout" if seed >= heldout_seed_start else "train"


def synthetic_seeds(split: str, n: int, start: int = 0, heldout_seed_start: int = HELDOUT_SEED_START) -> list[int]:
    """`n` consecutive seeds of `split` from offset `start` in that split's range (disjoint ranges)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if n < 0 or start < 0:
        raise ValueError(f"n and start must be >= 0, got {n}, {start}")
    first = start if split == "train" else heldout_seed_start + start
    if split == "train" and first + n > heldout_seed_start:
        raise ValueError(f"train seeds {first}..{first + n - 1} reach the held-out range (>= {heldout_seed_start})")
    return list(range(first, first + n))


def _value(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def make_synthetic_task(seed: int, *, n_constants: tuple[int, int] = (2, 4), value_range: tuple[int, int] = (10, 99),
                        name_style: str = "compound", heldout_seed_start: int = HELDOUT_SEED_START) -> Task:
    """The deterministic config-edit task for `seed` (module docstring). `name_style`: "compound"
    (PREFIX_SUFFIX, e.g. CACHE_TIMEOUT) or "simple" (one word of `SIMPLE_NAMES`)."""
    if name_style not in NAME_STYLES:
        raise ValueError(f"name_style must be one of {NAME_STYLES}, got {name_style!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    lo, hi = value_range
    if not 0 <= lo < hi:
        raise ValueError(f"value_range must be 0 <= lo < hi, got {value_range}")
    if not 1 <= n_constants[0] <= n_constants[1] <= len(PREFIXES):
        raise ValueError(f"n_constants must be 1 <= min <= max <= {len(PREFIXES)}, got {n_constants}")
    rng = random.Random(f"synthetic-config-{seed}")
    module = rng.choice(MODULES)
    n = rng.randint(*n_constants)
    # distinct prefixes and suffixes: no name is a substring of another, so "NAME = v" is unique
    if name_style == "simple":
        names = rng.sample(SIMPLE_NAMES, n)
    else:
        names = [f"{p}_{s}" for p, s in zip(rng.sample(PREFIXES, n), rng.sample(SUFFIXES, n))]
    values = [_value(rng, lo, hi) for _ in names]
    target = rng.randrange(n)
    old = values[target]
    new = _value(rng, lo, hi)
    while new == old:
        new = _value(rng, lo, hi)
    name = names[target]
    text = f'"""{module.capitalize()} constants."""\n' + "".join(f"{k} = {v}\n" for k, v in zip(names, values))
    assert text.count(f"{name} = {old}\n") == 1
    want = [(k, new if i == target else v) for i, (k, v) in enumerate(zip(names, values))]
    check = " and ".join(f"m.{k} == {v}" for k, v in want)
    test_cmd = f"python3 -B -c 'import sys, {module} as m; sys.exit(0 if {check} else 1)'"
    # value first: it sits at a fixed distance from the end of the prompt ("... to 17.") and is
    # the only number in the context; the name is copied by content afterwards
    solution = ({"name": "set", "args": {"value": str(new), "name": name}},)
    return Task(id=f"synth_{seed}", prompt=PROMPT_TEMPLATE.format(module=module, name=name, old=old, new=new),
                files={f"{module}.py": text}, test_cmd=test_cmd, reward_mode="binary", solution=solution,
                final_answer="Done.", kind="config", split=synthetic_split(seed, heldout_seed_start),
                metadata={"source": "synthetic", "seed": seed, "module": module, "name": name, "old": old,
                          "new": new, "family": "config_edit"})


def synthetic_task_from_id(task_id: str, **kw) -> Task:
    m = _ID_RE.fullmatch(task_id)
    if not m:
        raise ValueError(f"not a synthetic task id: {task_id!r} (expected synth_<seed>)")
    return make_synthetic_task(int(m.group(1)), **kw)


def make_synthetic_tasks(split: str, n: int, start: int = 0, **kw) -> list[Task]:
    return [make_synthetic_task(s, **kw) for s in synthetic_seeds(split, n, start)]


def reset_command(task: Task) -> str:
    """One POSIX shell command that empties /workspace and writes `task.files` (pooled-sandbox
    reset) with shell builtins: `printf` writes each file, `mkdir` runs only for a missing directory."""
    parts = [f"find {WORKSPACE} -mindepth 1 -delete"]
    for path, content in sorted(task.files.items()):
        full = f"{WORKSPACE}/{path}"
        parent = posixpath.dirname(full)
        if parent != WORKSPACE:
            parts.append(f"{{ [ -d {shlex.quote(parent)} ] || mkdir -p {shlex.quote(parent)}; }}")
        parts.append(f"printf %s {shlex.quote(content)} > {shlex.quote(full)}")
    return " && ".join(parts)


RESET_TIMEOUT_S = 30.0


def reset_sandbox(sandbox, task: Task, timeout: float = RESET_TIMEOUT_S) -> None:
    """Put `sandbox` back in `task`'s initial state with one exec; raises on failure."""
    r = sandbox.exec(reset_command(task), timeout=timeout, workdir="/")
    if r.exit_code != 0:
        raise RuntimeError(f"resetting sandbox for {task.id} failed (exit {r.exit_code}): {r.output[-300:]}")


def edit_solution(task: Task) -> dict:
    """The same edit as one built-in `edit_file` str_replace call (the `edit_file` variant)."""
    md = task.metadata
    return {"name": "edit_file", "args": {"command": "str_replace", "path": f"{WORKSPACE}/{md['module']}.py",
                                          "old_str": f"{md['name']} = {md['old']}",
                                          "new_str": f"{md['name']} = {md['new']}"}}


def set_constant(ctx: ToolContext, value: str, name: str) -> str:
    """The env's `set` tool: rewrite the line `NAME = ...` of the /workspace module defining NAME
    to `NAME = value` (one sandbox exec: grep for the file, sed -i, show the new line)."""
    if not CONST_RE.match(name):
        raise ToolArgError(f"name must be an UPPER_CASE constant name, got {name[:40]!r}")
    if not INT_RE.match(value.strip()):
        raise ToolArgError(f"value must be an integer, got {value[:40]!r}")
    v = value.strip()
    cmd = (f"f=$(grep -lE '^{name} = ' {WORKSPACE}/*.py 2>/dev/null | head -n 1); "
           f"[ -n \"$f\" ] || exit 3; sed -i -E 's/^{name} = .*/{name} = {v}/' \"$f\" && "
           f"grep -nE '^{name} = ' \"$f\" | sed \"s|^|$f:|\"")
    res = ctx.sandbox.exec(cmd, timeout=ctx.timeout_s, workdir="/")
    if res.exit_code == 3:
        raise ToolArgError(f"no constant {name} is defined in {WORKSPACE}/*.py")
    if res.exit_code != 0:
        raise ToolArgError(f"set failed (exit code {res.exit_code}): {res.output.strip()[:200]}")
    return f"Set. {res.output.strip()}"


SET_TOOL = Tool("set", "Set constant `name` (in the /workspace module defining it) to the integer `value`.",
                (Param("value", "str", True, "integer"),
                 Param("name", "str", True, "constant name, e.g. MAX_SIZE")), set_constant)


def synthetic_registry(strict: bool = True, tool: str = "set") -> ToolRegistry:
    """The environment's tool set (docs/SPEC.md §5 per-environment tools). `tool="set"` (default): the
    compact `set(name, value)` tool, executed in the sandbox; the call is ~95 bytes, which a
    tiny byte-level model learns in a few hundred SFT steps. `tool="edit_file"`: the built-in
    `edit_file` (same function and argument names) restricted to str_replace, for
    `edit_solution` calls and `EDIT_SYSTEM_PROMPT`."""
    if tool == "set":
        return ToolRegistry([SET_TOOL], strict=strict)
    if tool != "edit_file":
        raise ValueError(f"tool must be 'set' or 'edit_file', got {tool!r}")
    edit = BUILTIN_TOOLS["edit_file"]
    tool = Tool("edit_file", "Replace old_str (must occur once) by new_str in a file.",
                (Param("command", "str", True, "", enum=("str_replace",)),
                 Param("path", "str", True, "absolute path"),
                 Param("old_str", "str", True, ""),
                 Param("new_str", "str", True, "")), edit.fn)
    return ToolRegistry([tool], strict=strict)
