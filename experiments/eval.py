"""Evaluate policy checkpoints on a task set in sandboxes (docs/SPEC.md §7): mean accuracy, best-of-K, efficiency.

    python experiments/eval.py --config=configs/eval_tiny.py
    python experiments/eval.py --config=configs/eval_tiny.py --config.eval.checkpoints='("rl=runs/rl_tiny/ckpt",)'
    python experiments/eval.py --config=configs/eval_tiny.py --config.eval.num_passes=8 --config.eval.backend=local
    python experiments/eval.py --config=configs/eval_swegen.py --config.eval.task_path=runs/swegen/heldout.jsonl

Compares every entry of `c.eval.checkpoints` ("NAME=DIR"; an empty DIR = untrained init) on the same tasks and
passes ("NAME=@gold" / "NAME=@empty": the gold-patch and empty policies of a SWE-bench task set,
`eval.setup.patch_policy`); the tables report success per repository too (SWE-bench tasks; other tasks by kind).
With `eval.ledger` the SWE-bench episodes of the checkpoints named sft / rl are also appended to that study
ledger (docs/results/<study>.jsonl, `horizon.studies.swe_results`; docs/RESULTS.md is rebuilt from it).
Writes to `c.eval.output_dir`: records.jsonl (one line per episode), per_task.jsonl, summary.jsonl (one line per
policy, with provenance), results.md (the tables), best_of_k.png (pass@K vs K, mean dashed), TensorBoard events.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import jax
import numpy as np

from horizon.data.tokenizer import tokenizer_from_config
from horizon.eval import (
    EvalSetup,
    load_params,
    markdown_table,
    policy_from_params,
    run_eval,
    scripted_policy,
    summarize,
    write_jsonl,
)
from horizon.eval.report import best_of_k_plot, diagnosis_md, diagnosis_rows, repo_rows
from horizon.eval.setup import (
    build_tasks,
    checkpoint_list,
    patch_policy,
    registry_fn_for,
    system_prompt_for,
    task_repo,
    validate_eval_config,
)
from horizon.model import hf
from horizon.model.params import count_params
from horizon.studies.swe_results import record_eval, validate_ledger_config
from horizon.utils import cli
from horizon.utils.config import dump_config
from horizon.utils.provenance import Provenance
from horizon.utils.seeds import run_keys
from horizon.utils.tracking import MetricsWriter

OVERALL_COLS = ("accuracy", "best_of_*", "completion_tokens", "tool_calls", "turns", "summaries", "latency_s",
                "flops", "malformed_call_rate", "eager_edit_rate", "todo_completion_rate")


REPO_COLS = ("policy", "repo", "tasks", "accuracy", "best_of_1")


def load_config(argv=None):
    """The validated config of `argv` (exit 2 with one line on bad input)."""
    return cli.load(argv, default="configs/eval_tiny.py", doc=__doc__, prog="experiments/eval.py",
                    validate=lambda c: (validate_ledger_config(c.eval), validate_eval_config(c)),
                    derive=hf.apply_init_from)


def main(argv=None):
    c = load_config(argv)
    e, prov = c.eval, Provenance.start(c)
    out = pathlib.Path(e.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(c, out / "config.json")
    tok = tokenizer_from_config(c)
    tasks = build_tasks(e)
    active = int(count_params(c.model)["active"])
    setup = EvalSetup(agent_cfg=c.agent, tokenizer=tok, registry_fn=registry_fn_for(c), num_passes=int(e.num_passes),
                      max_parallel=int(e.max_parallel), backend=e.backend, verify_timeout_s=float(e.verify_timeout_s),
                      success_threshold=float(e.success_threshold), active_params=active,
                      system_prompt=system_prompt_for(c))
    print(f"{len(tasks)} tasks ({e.task_source}/{e.task_split}) x {e.num_passes} passes, backend {e.backend}, "
          f"active params {active:,}", flush=True)
    policies = checkpoint_list(e.checkpoints)
    records, per_task, overall, keys = [], [], [], run_keys(c.seed)
    for i, (name, path) in enumerate(policies):
        t0 = time.time()
        if path.startswith("@"):     # a patch policy (gold / empty): no model
            pol, setup_i, meta = *patch_policy(path, tok, setup), {"policy": path}
        else:
            params, meta = load_params(path, c, keys["init"])
            pol, setup_i = policy_from_params(params, c, jax.random.fold_in(keys["eval"], i),
                                              temperature=float(e.temperature), top_p=float(e.top_p)), setup
            if e.warmup:   # compile the sampler's shape buckets outside the timed episodes
                ctx = np.asarray(tok.encode((setup.system_prompt or "") + tasks[0].prompt), np.int32)
                pol([ctx] * min(len(tasks) * int(e.num_passes), int(e.max_parallel)), int(c.agent.max_new_tokens))
        recs = run_eval(pol, tasks, setup_i, policy_name=name, log=lambda s: print(s, flush=True))
        rows, o = summarize(recs)
        o.update(checkpoint=path or "(init)", checkpoint_step=meta.get("step"), eval_wall_s=time.time() - t0)
        o["ledger_rows"] = record_eval(c, name, recs, tasks, prov.fields(), command=" ".join(sys.argv),
                                       checkpoint=path)
        records += recs
        per_task += rows
        overall.append(o)
    if e.include_scripted:
        recs = run_eval(scripted_policy(tasks, tok), tasks, setup, policy_name="scripted")
        rows, o = summarize(recs)
        records += recs
        per_task += rows
        overall.append(o)
    per_repo, per_kind = repo_rows(per_task, {t.id: task_repo(t) for t in tasks}), diagnosis_rows(records)
    stamped = [prov.stamp(o) for o in overall]
    for k, v in dict(records=records, per_task=per_task, summary=stamped, per_repo=per_repo, per_kind=per_kind).items():
        write_jsonl(out / f"{k}.jsonl", v)
    n = int(e.num_passes)
    cols = ["policy"] + [c2 for col in OVERALL_COLS for c2 in
                         ([f"best_of_{k}" for k in range(1, n + 1)] if col == "best_of_*" else [col])]
    with MetricsWriter(out, c) as log:      # TensorBoard / W&B: each policy its own run, and the overall table
        for o in overall:
            log(dict(o, phase="eval", run=o["policy"]))
        log.table("eval/overall", [{k: o.get(k) for k in cols} for o in overall], 0)
    task_cols = ["policy", "task_id", "accuracy"] + [f"best_of_{k}" for k in range(1, n + 1)] + [
        "completion_tokens", "tool_calls", "turns", "summaries", "latency_s", "flops"]
    md = (f"# Eval: {len(tasks)} tasks ({e.task_source}/{e.task_split}) x {n} passes\n\n"
          f"Checkpoints: {json.dumps({k: v for k, v in policies})}. best_of_K = unbiased pass@K; flops = "
          f"2 x {active:,} active params x processed tokens (see horizon.eval.harness).\n\n"
          + markdown_table(overall, cols) + "\n## Per repository\n\n" + markdown_table(per_repo, REPO_COLS)
          + diagnosis_md(per_kind) + "\n## Per task\n\n" + markdown_table(per_task, task_cols))
    (out / "results.md").write_text(md)
    best_of_k_plot(overall, out / "best_of_k.png")
    print("\n" + markdown_table(overall, cols))
    print("\n" + markdown_table(per_repo, REPO_COLS) + diagnosis_md(per_kind))
    print(f"files: {out}/{{records.jsonl, per_task.jsonl, per_repo.jsonl, summary.jsonl, results.md, best_of_k.png, "
          "config.json}")
    return overall


if __name__ == "__main__":
    main(sys.argv[1:])
