"""Eval config (SPEC §7): which checkpoints to compare, on which tasks, how many passes.

`experiments/eval.py --config=configs/eval_tiny.py` evaluates every entry of
`c.eval.checkpoints` (name -> checkpoint dir; "" = a fresh random init from `c.seed`, the
UNTRAINED baseline) on the same task set and writes one table comparing them. The default
task set is held-out seeds of the synthetic config-edit family (`horizon.tasks.synthetic`),
the only family a tiny byte-level model can learn; `task_source="envs"` runs the hand-written
envs/tasks set instead. The `trained` checkpoint is produced by
`experiments/sft_synthetic.py --config=configs/eval_tiny.py` (SFT on scripted demonstrations of
train seeds) or can point at an RL run's `ckpt/` dir (experiments/rl.py).
"""

import ml_collections

from horizon.utils.config import sibling_config


def eval_section() -> ml_collections.ConfigDict:
    e = ml_collections.ConfigDict()
    e.task_source = "synthetic"      # "synthetic" (horizon.tasks.synthetic) | "envs" (load_tasks(tasks_root))
    e.task_split = "heldout"         # synthetic: "train" | "heldout" seeds; envs: split filter ("" = all)
    e.num_tasks = 8                  # synthetic: number of seeds; envs: first N tasks (0 = all)
    e.task_start = 0                 # synthetic: offset inside the split's seed range
    e.tasks_root = "envs/tasks"
    e.task_ids = ()                  # envs: explicit ids (overrides num_tasks)
    e.tool_set = "synthetic"         # "synthetic" (one-tool registry) | "agent" (registry_for(c.agent, kind))
    e.system_prompt = "synthetic"    # "synthetic" (horizon.tasks.synthetic.SYSTEM_PROMPT) | "" (the agent's own)
    e.num_passes = 4                 # N samples per task -> mean accuracy and best-of-K, K = 1..N
    e.success_threshold = 1.0        # a pass counts as solved for best-of-K iff reward >= this
    e.backend = "docker"             # "docker" | "local" (unisolated; tests/dev only)
    e.max_parallel = 8               # episodes (= live sandboxes) per lockstep run_episodes batch
    e.verify_timeout_s = 60.0
    e.temperature = 1.0              # sampling for checkpoint policies (best-of-K needs > 0)
    e.top_p = 1.0
    e.output_dir = "runs/eval_tiny"
    e.warmup = True                  # one untimed generation first, so latency_s excludes XLA compiles
    # name -> checkpoint dir holding orbax `state` (lm TrainState or rl RLState; `params` is used).
    # "" = fresh init from c.seed (the untrained baseline). Order = table order.
    e.checkpoints = ml_collections.ConfigDict({"untrained": "", "trained": "runs/sft_synthetic/checkpoints"})
    e.include_scripted = False       # add the scripted-solution policy as an upper-bound row
    return e


def sft_section() -> ml_collections.ConfigDict:
    """experiments/sft_synthetic.py: SFT on scripted demos of synthetic TRAIN seeds (disjoint from eval)."""
    s = ml_collections.ConfigDict()
    s.num_demos = 2048               # distinct train seeds rolled out with the scripted policy
    s.demo_seed_start = 0
    s.seq_len = 448                  # demo rows are padded to this (one compile); contexts ~140 + ~230 bytes
    s.demo_backend = "local"         # demos only need the edit's observation text
    s.verify_demos = 16              # run the verifier on the first N demos (each costs a python3 start)
    s.output_dir = "runs/sft_synthetic"
    return s


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "agent_tiny.py")
    # Same environment as experiments/rl.py's synthetic demo (configs/rl_tiny.py c.exp.agent), so its
    # checkpoints see the contexts they were trained on: short system prompt, one call per episode.
    c.model.max_seq_len = 512
    a = c.agent
    a.include_file_listing = False   # the synthetic prompt names the file; keeps contexts short
    a.max_turns = 1                  # one edit ends the episode (the synthetic task needs one call)
    a.max_new_tokens = 256           # the call is ~200 bytes (+ ~25 for a scripted/SFT <think>[step 0]</think>)
    a.max_context_tokens = 480
    a.trigger_tokens = 400
    a.context_strategy = "none"
    a.max_malformed_calls = 1
    a.num_tool_workers = 8
    a.tool_timeout_s = 20.0
    c.eval = eval_section()
    c.sft = sft_section()
    # SFT optimiser/schedule (read by horizon.train.lm through c.train)
    c.train.steps = 400
    c.train.lr = 3e-3
    c.train.warmup_steps = 20
    c.train.min_lr_ratio = 0.1
    c.train.log_every = 10
    c.train.checkpoint_every = 100
    c.train.max_checkpoints = 1
    c.data.batch_size = 8
    return c
