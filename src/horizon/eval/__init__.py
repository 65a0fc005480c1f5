"""horizon.eval: eval harness (mean accuracy, best-of-K, efficiency), behaviour evals, reports (docs/SPEC.md §7).

    from horizon.eval import EvalSetup, run_eval, summarize, pass_at_k
    records = run_eval(policy, tasks, EvalSetup(agent_cfg, tok, registry_fn, num_passes=4))
    per_task, overall = summarize(records)
"""

from horizon.eval.behaviour import behaviour_metrics, eager_edit
from horizon.eval.harness import (
    EvalSetup,
    inference_flops,
    load_params,
    pass_at_k,
    policy_from_params,
    run_eval,
    scripted_policy,
    summarize,
)
from horizon.eval.report import markdown_table, plot_jsonl, read_jsonl, write_jsonl

__all__ = ["behaviour_metrics", "eager_edit", "EvalSetup", "inference_flops", "load_params", "pass_at_k",
           "policy_from_params", "run_eval", "scripted_policy", "summarize", "markdown_table", "plot_jsonl",
           "read_jsonl", "write_jsonl"]
