"""The eval driver's config (configs/eval_tiny.py, docs/SPEC.md §7): its task list, tool registry, system
prompt and checkpoints, and `validate_eval_config`, which checks all of them (paths included)
before experiments/eval.py creates its output dir or opens a sandbox."""

from __future__ import annotations

import dataclasses
import pathlib

from horizon.agent import validate_agent_config
from horizon.agent.scripted import ScriptedPolicy
from horizon.data.tokenizer import validate_tokenizer
from horizon.inference.config import validate_engine
from horizon.model import transformer
from horizon.parallel.mesh import validate_mesh
from horizon.tasks import load_tasks, open_task_sandbox
from horizon.tasks.swebench import apply_patch, load_swebench
from horizon.tasks.synthetic import SYSTEM_PROMPT, make_synthetic_tasks, synthetic_registry
from horizon.tools.builtin import registry_for
from horizon.tools.format import render_final
from horizon.utils.config import ConfigError, need, need_choice, need_float, need_int


def build_tasks(e):
    """The eval task list from `c.eval` (see configs/eval_tiny.py)."""
    if e.task_source == "synthetic":
        opts = e.get("task_options") or {}
        return make_synthetic_tasks(e.task_split, int(e.num_tasks), int(e.task_start),
                                    **{k: tuple(v) if isinstance(v, list) else v for k, v in dict(opts).items()})
    if e.task_source == "envs":
        tasks = load_tasks(e.tasks_root, split=e.task_split or None)
        if e.task_ids:
            by_id = {t.id: t for t in tasks}
            missing = [i for i in e.task_ids if i not in by_id]
            if missing:
                raise ConfigError(f"eval.task_ids: unknown task ids {missing} in {e.tasks_root}")
            return [by_id[i] for i in e.task_ids]
        return tasks[: int(e.num_tasks)] if int(e.num_tasks) > 0 else tasks
    if e.task_source == "swebench":
        tasks = load_swebench(str(e.task_path))
        return tasks[: int(e.num_tasks)] if int(e.num_tasks) > 0 else tasks
    raise ConfigError(f"eval.task_source={e.task_source!r}: must be 'synthetic', 'envs' or 'swebench'")


# Patch policies (`eval.checkpoints` entries "NAME=@gold" / "NAME=@empty", task sets whose tasks carry
# a gold patch: SWE-bench): the episode's sandbox starts with the task's gold patch applied (@gold)
# or as is (@empty), and the policy ends the episode at once; the verifier grades the result.
PATCH_POLICIES = ("@gold", "@empty")


def patch_policy(kind: str, tokenizer, setup):
    """(policy, setup) of a patch policy: the policy answers `<final>` at once; the returned setup
    opens each task's sandbox as `setup` does and, for @gold, applies the task's gold patch."""
    if kind not in PATCH_POLICIES:
        raise ConfigError(f"eval.checkpoints: unknown patch policy {kind!r} (one of {PATCH_POLICIES})")
    pol = ScriptedPolicy({"": [render_final("Done.")]}, tokenizer)

    base_open = setup.open_fn or (lambda t: open_task_sandbox(t, backend=setup.backend))

    def open_patched(task):
        sb = base_open(task)
        if kind == "@gold":
            r = apply_patch(sb, task.metadata["patch"])
            if not r.ok:
                sb.close()
                raise RuntimeError(f"{task.id}: the gold patch does not apply: {r.output[-300:]}")
        return sb
    return pol, dataclasses.replace(setup, open_fn=open_patched)


def task_repo(task) -> str:
    """The repository a task comes from (SWE-bench tasks: metadata["repo"]; others: their kind)."""
    return str((task.metadata or {}).get("repo") or task.kind)


def registry_fn_for(c):
    """task -> ToolRegistry for `eval.tool_set`."""
    if c.eval.tool_set == "synthetic":
        reg = synthetic_registry(strict=bool(c.agent.strict_tools))
        return lambda task: reg
    if c.eval.tool_set == "agent":
        return lambda task: registry_for(c.agent, task.kind)
    raise ConfigError(f"eval.tool_set={c.eval.tool_set!r}: must be 'synthetic' or 'agent'")


def system_prompt_for(c) -> str | None:
    """The system prompt `eval.system_prompt` names (None = the agent's own)."""
    if c.eval.system_prompt == "synthetic":
        return SYSTEM_PROMPT
    if c.eval.system_prompt:
        raise ConfigError(f"eval.system_prompt={c.eval.system_prompt!r}: must be 'synthetic' or ''")
    return None


def checkpoint_list(entries) -> list[tuple[str, str]]:
    """`eval.checkpoints` ("NAME=DIR"; an empty DIR = untrained init) as [(name, dir)]."""
    out = []
    for item in entries:
        name, sep, path = str(item).partition("=")
        if not sep or not name:
            raise ConfigError(f"eval.checkpoints entry {item!r}: must be 'NAME=DIR' (an empty DIR = untrained init)")
        out.append((name, path))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"eval.checkpoints: names must be unique, got {names}")
    return out


def validate_eval_config(c) -> None:
    """Every field experiments/eval.py reads: model, agent budget, the `eval` section, the task list
    (built here: a missing tasks_root or task id fails now) and each checkpoint dir's existence."""
    transformer.validate_config(c.model)
    validate_tokenizer(c.model)
    validate_agent_config(c.agent, max_seq_len=int(c.model.max_seq_len))
    if "mesh" in c:                                  # sampling runs sharded over it

        validate_mesh(c, power_of_two_ranks=True)
    if "rl" in c and "sampler" in c.rl:              # the sampler section of the run it evaluates (the engine)
        validate_engine(c)
    e = c.eval
    need_choice(e, "task_source", "eval", ("synthetic", "envs", "swebench"))
    need_choice(e, "backend", "eval", ("docker", "local"))
    need_int(e, "num_passes", "eval", lo=1)
    need_int(e, "max_parallel", "eval", lo=1)
    need_int(e, "num_tasks", "eval", lo=0 if e.task_source in ("envs", "swebench") else 1)
    need_int(e, "task_start", "eval", lo=0)
    need_float(e, "verify_timeout_s", "eval", 0.0, lo_open=True)
    need_float(e, "success_threshold", "eval", 0.0, 1.0)
    need_float(e, "temperature", "eval", 0.0)
    need_float(e, "top_p", "eval", 0.0, 1.0, lo_open=True)
    need(bool(str(e.output_dir)), "eval.output_dir", e.output_dir, "must name a directory")
    if e.task_source == "envs":
        need(pathlib.Path(str(e.tasks_root)).is_dir(), "eval.tasks_root", e.tasks_root, "no such directory")
    if e.task_source == "swebench":
        need(pathlib.Path(str(e.task_path)).is_file(), "eval.task_path", e.task_path,
             "no such SWE-bench JSONL file (envs/build_repo_images.py writes runs/swegen/heldout.jsonl)")
    try:
        tasks = build_tasks(e)
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(f"eval task set: {' '.join(str(err).split())}") from None
    need(len(tasks) > 0, "eval.num_tasks", e.num_tasks, f"selects no task from {e.task_source}")
    registry_fn_for(c)
    system_prompt_for(c)
    entries = checkpoint_list(e.checkpoints)
    need(len(entries) > 0 or bool(e.include_scripted), "eval.checkpoints", e.checkpoints,
         "must name at least one policy (or set eval.include_scripted)")
    for name, path in entries:
        if path.startswith("@"):
            need(path in PATCH_POLICIES, f"eval.checkpoints[{name}]", path, f"patch policies are {PATCH_POLICIES}")
            need(all("patch" in (t.metadata or {}) for t in tasks), f"eval.checkpoints[{name}]", path,
                 "patch policies need tasks with a gold patch (eval.task_source='swebench')")
            continue
        need(not path or pathlib.Path(path).is_dir(), f"eval.checkpoints[{name}]", path,
             "no such checkpoint directory (run `make run` first, or leave DIR empty for the untrained init)")
