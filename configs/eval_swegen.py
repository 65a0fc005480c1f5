"""Eval on a generated SWE-bench task set (docs/SPEC.md §7): the held-out repositories' instances
(envs/build_repo_images.py writes runs/swegen/heldout.jsonl) with the gold-patch policy (must be
1.000), the empty policy (must be 0.000) and the tiny model (untrained init; add trained
checkpoints as "NAME=DIR"). The table reports success per repository.

    python experiments/eval.py --config=configs/eval_swegen.py
    python experiments/eval.py --config=configs/eval_swegen.py --config.eval.task_path=runs/swegen/train.jsonl
"""

from horizon.utils.config import sibling_config


def get_config():
    c = sibling_config(__file__, "eval_tiny.py")
    e = c.eval
    e.task_source = "swebench"
    e.task_path = "runs/swegen/heldout.jsonl"
    e.num_tasks = 0                  # every instance of the file
    e.tool_set = "agent"             # the agent's tools (read_file, edit_file, run_shell, ...)
    e.system_prompt = ""             # the agent's own system prompt
    e.num_passes = 1
    e.max_parallel = 4               # live sandboxes (each grades its repository's suite)
    e.verify_timeout_s = 300.0
    e.warmup = False
    e.output_dir = "runs/eval_swegen"
    e.checkpoints = ("gold=@gold", "empty=@empty", "tiny=")
    # A SWE-bench prompt (problem statement + the agent's tool descriptions) is ~3k byte tokens: the
    # tiny model gets a context that holds it (make run's is 256) and a short budget (it is untrained).
    c.model.max_seq_len = 4096
    c.agent.update(dict(max_turns=2, max_new_tokens=64, max_context_tokens=4000, trigger_tokens=3900,
                        include_file_listing=False))
    c.rl.sampler.engine_slots = 4     # = max_parallel
    return c
