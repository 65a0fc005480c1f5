"""Eval config (docs/SPEC.md §7): which checkpoints to compare, on which tasks, how many passes.

`experiments/eval.py --config=configs/eval_tiny.py` evaluates every entry of
`c.eval.checkpoints` ("NAME=DIR" strings; an empty DIR = a fresh random init from `c.seed`, the
UNTRAINED baseline) on the same task set and writes one table comparing them. The default
task set is held-out seeds of the config-edit family in exactly the environment `make run`
trains in (configs/rl_tiny.py's model, agent and task options, the env's system prompt and
`set` tool), and the checkpoints are that run's SFT stage and its final RL state
(`runs/rl_tiny/sft`, `runs/rl_tiny/ckpt`): run `make run` first. `task_source="envs"` runs the
hand-written envs/tasks set instead. Override the list with e.g.
`--config.eval.checkpoints='("rl=runs/rl_tiny/ckpt",)'`.
"""

import ml_collections

from horizon.utils.config import sibling_config
from horizon.utils.tracking import tracking_fields


def eval_section(exp: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    e = ml_collections.ConfigDict()
    e.task_source = "synthetic"      # "synthetic" (the config-edit family) | "envs" (load_tasks(tasks_root)) |
    #                                  "swebench" (a SWE-bench JSONL at task_path, e.g. runs/swegen/heldout.jsonl)
    e.task_split = "heldout"         # synthetic: "train" | "heldout" seeds; envs: split filter ("" = all)
    e.num_tasks = 32                 # synthetic: number of seeds; envs / swebench: first N tasks (0 = all)
    # swebench: the task set (SWE-bench JSONL with image tags; envs/build_repo_images.py)
    e.task_path = ""
    e.task_start = 0                 # synthetic: offset inside the split's seed range
    e.task_options = ml_collections.ConfigDict(exp.task.to_dict())   # synthetic: the RL run's task options
    e.tasks_root = "envs/tasks"
    e.task_ids = ()                  # envs: explicit ids (overrides num_tasks)
    e.tool_set = "synthetic"         # "synthetic" (one-tool registry) | "agent" (registry_for(c.agent, kind))
    e.system_prompt = "synthetic"    # "synthetic" (horizon.tasks.synthetic.SYSTEM_PROMPT) | "" (the agent's own)
    e.num_passes = 4                 # N samples per task -> mean accuracy and best-of-K, K = 1..N
    e.success_threshold = 1.0        # a pass counts as solved for best-of-K iff reward >= this
    e.backend = "docker"             # "docker" | "local" (unisolated; tests/dev only)
    e.max_parallel = 16              # episodes (= live sandboxes) per run_episodes call
    e.verify_timeout_s = 60.0
    e.temperature = 1.0              # sampling for checkpoint policies (best-of-K needs > 0)
    e.top_p = 1.0
    e.output_dir = "runs/eval_tiny"  # records.jsonl, per_task.jsonl, summary.jsonl, results.md, best_of_k.png
    e.warmup = True                  # one untimed generation first, so latency_s excludes XLA compiles
    e.ledger = ""                    # a study ledger docs/results/<study>.jsonl (from the repository root) that
    #                                  the SWE-bench episodes of checkpoints named "sft" / "rl" are appended to, one
    #                                  row each with provenance (horizon.studies.swe_results); "" = none
    e.ledger_split = "unseen"        # what those episodes are: "unseen" (train repositories) | "heldout"
    # "NAME=DIR": DIR holds orbax `state` (lm TrainState or rl RLState; `params` is used); an empty
    # DIR = fresh init from c.seed (the untrained baseline); DIR "@gold" / "@empty" (swebench task sets): the
    # gold-patch / empty policy (the sandbox starts patched / as is, the episode ends at once). Order = table order.
    e.checkpoints = ("untrained=", "sft=runs/rl_tiny/sft", "rl=runs/rl_tiny/ckpt")
    e.include_scripted = False       # add the scripted-solution policy as an upper-bound row
    return e


def get_config() -> ml_collections.ConfigDict:
    rl = sibling_config(__file__, "rl_tiny.py")      # the environment the RL run trained in
    c = ml_collections.ConfigDict()
    c.seed = rl.seed
    c.model = rl.model
    c.mesh = rl.mesh                                 # sampling runs sharded over it (docs/SPEC.md §2)
    c.agent = rl.agent
    c.rl = ml_collections.ConfigDict(dict(sampler=rl.rl.sampler))   # the RL run's sampler: the rollout engine's
    #                                                 sizes (rl.sampler.engine_*); temperature / top_p come from `eval`
    c.eval = eval_section(rl.exp)
    c.exp = ml_collections.ConfigDict(tracking_fields())   # eval tables in TensorBoard / W&B (horizon.utils.tracking)
    return c
