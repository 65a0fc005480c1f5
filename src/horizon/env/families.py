"""Procedural task families as RL environments: the environment layer above the agent (SPEC §4, §5, §6).

A `Family` bundles what a driver needs to run RL on a generated task family: tasks by
seed with disjoint train/held-out ranges, the env's system prompt and tool registry
(SPEC §5 per-environment tool sets), how to reset a pooled sandbox, how to verify, and
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

`family_from_config(c.exp)` builds one from an experiment config (`exp.env`, `exp.task`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from horizon.tasks import key_recall, synthetic
from horizon.tasks.task import Task

FAMILIES = ("config_edit", "key_recall", "key_relay")


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    system_prompt: str
    make_task: Callable[[int], Task]                        # seed -> task
    seeds: Callable[[str, int, int], list[int]]             # (split, n, start) -> seeds
    registry: Callable[[bool], object]                      # strict -> ToolRegistry
    check_edits: bool = True                                # verifier's eager-edit check (answer tasks)

    def tasks(self, split: str, n: int, start: int = 0) -> list[Task]:
        return [self.make_task(s) for s in self.seeds(split, n, start)]

    def reset(self, sandbox, task: Task) -> None:
        """Put a pooled sandbox into `task`'s initial state (one exec)."""
        synthetic.reset_sandbox(sandbox, task)


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
                                                   n_keys=n_keys)
        # the env's only tool reads: no edit is possible, so the eager-edit check is skipped
        return Family(e.env, key_recall.SYSTEM_PROMPT, make, key_recall.key_recall_seeds,
                      key_recall.key_recall_registry, check_edits=False)
    raise ValueError(f"exp.env must be one of {FAMILIES}, got {e.env!r}")


def make_episode(family: Family, task: Task, sandbox, tok, agent_cfg):
    """An `Episode` of `task` with the family's system prompt and tools."""
    from horizon.agent import Episode, Message

    ep = Episode(task, sandbox, family.registry(bool(agent_cfg.strict_tools)), tok, agent_cfg)
    ep.messages[0] = Message("system", family.system_prompt, kind="system")
    return ep
