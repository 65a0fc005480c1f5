"""Procedural task families as RL environments: the environment layer above the agent (docs/SPEC.md §4, §5, §6).

A `Family` bundles what a driver needs to run RL on a generated task family: tasks by
seed with disjoint train/held-out ranges, the env's system prompt and tool registry
(docs/SPEC.md §5 per-environment tool sets), how to reset a pooled sandbox, how to verify, and
demonstrations for the SFT warm start. Two families exist:

- ``config_edit`` (`horizon.tasks.synthetic`): one `set(value, name)` call; demos are the
  canonical call, a fraction with a wrong value (`corrupt_prob`: imperfect demonstrations
  leave RL something to fix).
- ``key_recall`` (`horizon.tasks.key_recall`): read a key, then logs until the context is
  compacted; answer the key. Demos are `DemoPolicy` chains rolled out through the real
  agent loop (`Episode`), so every segment, summary query and state block is exactly what
  the policy will see; a fraction of summaries is lossy (`corrupt_prob`).
- ``key_relay`` (the same module with `exp.task.n_keys` >= 2): keys arrive at different times
  (key.txt, then logs spread over the run) and the answer is every key in order, so an episode
  needs >= 2 summaries and a summary must carry forward what an earlier one held; the same
  demonstrator (it writes every key the context holds).
  With `exp.task.n_memos` and `exp.task.pin_prob` it is the long-horizon family of the RL
  self-summarization study (configs/selfsum_rl.py): distractor memos and a pin whose importance
  shows only in the last log (`horizon.tasks.key_recall`, "Long horizons").

- ``swebench`` (`horizon.tasks.swebench`): a SWE-bench JSONL task set (e.g. the generator's
  runs/swegen/train.jsonl and heldout.jsonl: `exp.task.train_path`, `exp.task.heldout_path`); train
  seeds index the train file (wrapping: epochs), held-out seeds the held-out file. Each task runs in
  its own prepared image (`Family.image_of`: the pool reopens a box whose image differs), reset
  = the tree back to the image's commit; the agent's built-in tools and system prompt; graded per
  test (`swebench.grade`). No demonstrations: start RL from a checkpoint (`model.init_from`).

`family_from_config(c.exp)` builds one from an experiment config (`exp.env`, `exp.task`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import ml_collections
import numpy as np

from horizon.agent import Episode
from horizon.sandbox.base import WORKSPACE
from horizon.tasks import key_recall, synthetic
from horizon.tasks.swebench import load_swebench
from horizon.tasks.task import Task
from horizon.tools.builtin import make_registry

FAMILIES = ("config_edit", "key_recall", "key_relay", "swebench")
HELDOUT_SEED_BASE = 1 << 30          # swebench: seeds >= this index the held-out file


class ResetStep(NamedTuple):
    """A task's reset: one POSIX shell command, its working directory and time limit. Run alone
    (`run`) or inside the sandbox's prepare action (`horizon.env.rollouts.SandboxPool.ready`),
    which bounds it by its own deadline (a reset past it is the box's failure)."""
    command: str
    workdir: str
    timeout: float

    def run(self, sandbox):
        return sandbox.exec(self.command, timeout=self.timeout, workdir=self.workdir)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    system_prompt: str
    make_task: Callable[[int], Task]                        # seed -> task
    seeds: Callable[[str, int, int], list[int]]             # (split, n, start) -> seeds
    registry: Callable[[bool], object]                      # strict -> ToolRegistry
    check_edits: bool = True                                # verifier's eager-edit check (answer tasks)
    image_of: Callable[[Task], str] | None = None           # per-task sandbox image (None: the pool's image)
    reset_cmd: Callable[[Task], ResetStep] | None = None    # task -> its reset; None = synthetic's

    def tasks(self, split: str, n: int, start: int = 0) -> list[Task]:
        return [self.make_task(s) for s in self.seeds(split, n, start)]

    def reset_step(self, task: Task) -> ResetStep:
        """The one command that puts a pooled sandbox into `task`'s initial state."""
        if self.reset_cmd is not None:
            return self.reset_cmd(task)
        return ResetStep(synthetic.reset_command(task), "/", synthetic.RESET_TIMEOUT_S)

    def reset(self, sandbox, task: Task) -> None:
        """Put a pooled sandbox into `task`'s initial state (one exec)."""
        check_reset(self.reset_step(task).run(sandbox), task)


def check_reset(r, task: Task) -> None:
    """RuntimeError (the box's failure, not an episode's) unless the reset's ExecResult `r` is clean."""
    if r.exit_code != 0:
        name = getattr(task, "id", "a task")
        raise RuntimeError(f"resetting sandbox for {name} failed (exit {r.exit_code}): {r.output[-300:]}")


@functools.lru_cache(maxsize=8)
def _swebench_tasks(path: str) -> tuple[Task, ...]:
    return tuple(load_swebench(path))


def swebench_reset(task: Task, timeout: float = 60.0) -> ResetStep:
    """A pooled box of the task's prepared image back to the image's commit: git restores the
    tracked files and removes the rest, nothing is copied (docs/SANDBOX.md "Prepare and reset")."""
    if not task.metadata.get("prepared_image"):
        raise ValueError(f"swebench family: task {task.id} has no prepared image")
    return ResetStep("git checkout -q -f HEAD -- . && git clean -fdxq", WORKSPACE, timeout)


def swebench_family(t) -> Family:
    """The ``swebench`` family over `t.train_path` / `t.heldout_path` (module docstring)."""
    train = _swebench_tasks(str(t.train_path))
    heldout = _swebench_tasks(str(t.heldout_path)) if t.get("heldout_path") else ()
    if not train:
        raise ValueError(f"exp.task.train_path={t.train_path!r}: no instances")
    if any(not x.image for x in train + heldout):
        raise ValueError("swebench family: every instance needs an image tag (envs/build_repo_images.py writes them)")

    def seeds(split, n, start=0):
        if split == "heldout":
            return [HELDOUT_SEED_BASE + i for i in range(int(start), min(int(start) + int(n), len(heldout)))]
        return list(range(int(start), int(start) + int(n)))

    def make(seed):
        return heldout[seed - HELDOUT_SEED_BASE] if seed >= HELDOUT_SEED_BASE else train[seed % len(train)]
    return Family("swebench", "", make, seeds, lambda strict: make_registry(None, strict=strict),
                  image_of=lambda task: task.image, reset_cmd=swebench_reset)


def family_from_config(e) -> Family:
    """The family named by `e.env` with its task options `e.task` (an experiment config)."""
    t = e.task
    if e.env == "config_edit":
        def make(seed, _t=t):
            return synthetic.make_synthetic_task(seed, value_range=tuple(_t.value_range), name_style=str(_t.name_style))
        return Family("config_edit", synthetic.SYSTEM_PROMPT, make, synthetic.synthetic_seeds,
                      lambda strict: synthetic.synthetic_registry(strict=strict))
    if e.env in ("key_recall", "key_relay"):
        n_keys = int(t.get("n_keys", 1))
        if (e.env == "key_relay") != (n_keys > 1):
            raise ValueError(f"exp.task.n_keys={n_keys}: key_relay needs >= 2 keys, key_recall exactly 1")

        def make(seed, _t=t):
            return key_recall.make_key_recall_task(seed, n_logs=int(_t.n_logs), log_lines=int(_t.log_lines),
                                                   n_decoys=int(_t.n_decoys), key_alphabet=str(_t.key_alphabet),
                                                   n_keys=n_keys, slot_alphabets=bool(_t.get("slot_alphabets", False)),
                                                   n_memos=int(_t.get("n_memos", 0)),
                                                   pin_prob=float(_t.get("pin_prob", 0.0)))
        # the env's only tool reads: no edit is possible, so the eager-edit check is skipped
        return Family(e.env, key_recall.SYSTEM_PROMPT, make, key_recall.key_recall_seeds,
                      key_recall.key_recall_registry, check_edits=False)
    if e.env == "swebench":
        return swebench_family(t)
    raise ValueError(f"exp.env must be one of {FAMILIES}, got {e.env!r}")


def first_turn_contexts(c, n: int, tok) -> list[np.ndarray]:
    """The first-turn contexts of `n` held-out tasks of `c.exp`'s family, as an episode renders them
    (no sandbox: the file listing is left out): the prompts of the sampler benchmarks."""
    agent = ml_collections.ConfigDict(c.agent.to_dict())
    agent.include_file_listing = False
    family = family_from_config(c.exp)
    return [np.asarray(make_episode(family, t, None, tok, agent).context_tokens(), np.int32)
            for t in family.tasks("heldout", n)]


def make_episode(family: Family, task: Task, sandbox, tok, agent_cfg):
    """An `Episode` of `task` with the family's system prompt and tools."""
    # family.system_prompt "" = the agent's own system prompt
    return Episode(task, sandbox, family.registry(bool(agent_cfg.strict_tools)), tok, agent_cfg,
                   system_text=family.system_prompt)
