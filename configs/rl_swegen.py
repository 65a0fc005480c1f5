"""RL on a generated SWE-bench task set (docs/SPEC.md §4, §5, §7): `make run`'s loop
(configs/rl_tiny.py) with the ``swebench`` family (`horizon.env.families`): train prompts from
`exp.task.train_path`, held-out eval on `exp.task.heldout_path` (held-out repositories), each
episode in its instance's prepared image with the agent's tools, graded per test. No SFT stage
(a task set has no demonstrations): RL starts from `model.init_from` or the init.

    python envs/build_repo_images.py --config.gen.n_candidates=60 ...     # writes runs/swegen/{train,heldout}.jsonl
    python experiments/rl.py --config=configs/rl_swegen.py --config.exp.task.train_path=runs/swegen/train.jsonl

Memory: on CPU the one-pass train step over the 32-row bucket at this 4k context does not fit (it ran
out of memory in `core.train_groups`, after the step-0 held-out eval). The step is sized from
benchmarks/rl_step_memory.py (docs/PERF.md "RL on the SWE-bench set: train-step memory at 4k tokens"):
`model.remat` and `rl.batch.micro_rows=4`, and experiments/rl.py refuses in one line, before any sandbox
or eval, a setting that would not fit (`rl.memory_check`). The end-to-end run on a small set (parse +
inflection) is in the same docs/PERF.md section; the untrained model's calls are all malformed (reward:
the malformed-call penalty).
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "rl_tiny.py")
    e = c.exp
    e.env = "swebench"
    e.task = ml_collections.ConfigDict(dict(
        train_path="runs/swegen/train.jsonl",      # SWE-bench JSONL with image tags (envs/build_repo_images.py)
        heldout_path="runs/swegen/heldout.jsonl",  # held-out repositories' instances ("" = none)
    ))
    e.out_dir = "runs/rl_swegen"
    e.n_sft_tasks = 0                 # train prompts start at the first instance
    e.pool_size = 8                   # each box runs its instance's image (reopened when the image differs)
    e.sandbox_cpus = 1.0
    e.sandbox_mem = "1g"
    e.sandbox_disk_mb = 512
    e.verify_timeout_s = 300.0        # grading runs the instance's test files
    e.eval.n_tasks = 8
    e.eval.passes = 1
    c.rl.prompts_per_step = 2
    c.rl.group_size = 4
    # A SWE-bench prompt (problem statement + the agent's tool descriptions) is ~3k byte tokens: the
    # context must hold it (make run's is 256; configs/eval_swegen.py makes the same choice), else
    # every episode ends "context_full" before its first turn.
    c.model.max_seq_len = 4096
    c.agent.update(dict(max_turns=2, max_new_tokens=64, max_context_tokens=4000, trigger_tokens=3900,
                        include_file_listing=False))
    # The train step at 4k tokens (benchmarks/rl_step_memory.py --config=configs/rl_swegen.py --rows 0, XLA's
    # temporaries; docs/PERF.md "RL on the SWE-bench set"): the one-pass 32-row bucket (8 chains padded to
    # rl.batch.min_rows) needs 92.9 GiB (57.1 GiB with remat); micro-batches of 8 / 4 / 2 chains with remat
    # 14.7 / 7.4 / 3.7 GiB.
    c.model.remat = True              # each layer recomputed in the backward pass: -37% temporaries here
    c.rl.batch.micro_rows = 4         # gradient accumulation over 2 micro-batches of 4 chains: 7.4 GiB, a third
    #                                   of this 23 GB machine (rl.memory_check guards the rest)
    return c
