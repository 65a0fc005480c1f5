"""Evaluate policy checkpoints on a task set in sandboxes (SPEC §7): mean accuracy, best-of-K, efficiency.

    python experiments/eval.py --config=configs/eval_tiny.py
    python experiments/eval.py --config=configs/eval_tiny.py --checkpoint=runs/rl_tiny/ckpt
    python experiments/eval.py --config=configs/eval_tiny.py --checkpoint=sft=runs/rl_tiny/sft \
        --set eval.num_passes=8 --set eval.backend=local

Compares every entry of `c.eval.checkpoints` (name -> dir, "" = untrained init) or the
`--checkpoint` list on the same tasks and passes. Writes to `c.eval.output_dir` (or --out):
records.jsonl (one line per episode), per_task.jsonl, summary.jsonl (one line per policy),
results.md (the tables) and best_of_k.png (pass@K vs K per policy, mean accuracy dashed).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import numpy as np

from horizon.data.tokenizer import ByteTokenizer
from horizon.eval import EvalSetup, load_params, markdown_table, policy_from_params, run_eval, scripted_policy
from horizon.eval import summarize, write_jsonl
from horizon.model.params import count_params
from horizon.utils.config import apply_overrides, dump_config, load_config_file

OVERALL_COLS = ("accuracy", "best_of_*", "completion_tokens", "tool_calls", "turns", "summaries", "latency_s",
                "flops", "malformed_call_rate", "eager_edit_rate", "todo_completion_rate")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/eval_tiny.py")
    p.add_argument("--checkpoint", action="append", default=[], metavar="[NAME=]DIR",
                   help="checkpoint(s) to evaluate instead of c.eval.checkpoints ('' dir = untrained init)")
    p.add_argument("--out", default=None, help="output dir (default c.eval.output_dir)")
    p.add_argument("--set", action="append", default=[], metavar="a.b=VALUE",
                   help="override a config field (JSON-parsed when possible), e.g. --set eval.num_passes=2")
    return p.parse_args(argv)


def build_tasks(e):
    """The eval task list from `c.eval` (see configs/eval_tiny.py)."""
    if e.task_source == "synthetic":
        from horizon.tasks.synthetic import make_synthetic_tasks
        opts = e.get("task_options") or {}
        return make_synthetic_tasks(e.task_split, int(e.num_tasks), int(e.task_start),
                                    **{k: tuple(v) if isinstance(v, list) else v for k, v in dict(opts).items()})
    if e.task_source == "envs":
        from horizon.tasks import load_tasks
        tasks = load_tasks(e.tasks_root, split=e.task_split or None)
        if e.task_ids:
            by_id = {t.id: t for t in tasks}
            missing = [i for i in e.task_ids if i not in by_id]
            if missing:
                raise KeyError(f"unknown task ids {missing}")
            return [by_id[i] for i in e.task_ids]
        return tasks[: int(e.num_tasks)] if int(e.num_tasks) > 0 else tasks
    raise ValueError(f"eval.task_source must be 'synthetic' or 'envs', got {e.task_source!r}")


def registry_fn_for(c):
    if c.eval.tool_set == "synthetic":
        from horizon.tasks.synthetic import synthetic_registry
        reg = synthetic_registry(strict=bool(c.agent.strict_tools))
        return lambda task: reg
    if c.eval.tool_set == "agent":
        from horizon.tools.builtin import registry_for
        return lambda task: registry_for(c.agent, task.kind)
    raise ValueError(f"eval.tool_set must be 'synthetic' or 'agent', got {c.eval.tool_set!r}")


def system_prompt_for(c) -> str | None:
    if c.eval.system_prompt == "synthetic":
        from horizon.tasks.synthetic import SYSTEM_PROMPT
        return SYSTEM_PROMPT
    if c.eval.system_prompt:
        raise ValueError(f"eval.system_prompt must be 'synthetic' or '', got {c.eval.system_prompt!r}")
    return None


def checkpoint_list(c, cli: list[str]) -> list[tuple[str, str]]:
    if not cli:
        return [(k, str(v)) for k, v in c.eval.checkpoints.items()]
    out = []
    for i, item in enumerate(cli):
        name, sep, path = item.partition("=")
        out.append((name, path) if sep else (f"ckpt{i}" if len(cli) > 1 else "checkpoint", item))
    return out


def best_of_k_plot(overall: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for o in overall:
        ks = list(range(1, int(o["n"]) + 1))
        line, = ax.plot(ks, [o[f"best_of_{k}"] for k in ks], marker="o", label=f"{o['policy']} best-of-K")
        ax.axhline(o["accuracy"], ls="--", color=line.get_color(), alpha=0.7, label=f"{o['policy']} mean")
    ax.set_xlabel("K (passes)"), ax.set_ylabel("accuracy"), ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3), ax.legend(fontsize=8), ax.set_title("mean vs best-of-K (unbiased pass@K)")
    fig.tight_layout(), fig.savefig(path, dpi=100), plt.close(fig)


def main(argv=None):
    a = parse_args(argv)
    c = load_config_file(a.config)
    apply_overrides(c, a.set)
    e = c.eval
    out = pathlib.Path(a.out or e.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(c, out / "config.json")
    tok = ByteTokenizer(c.model.vocab_size)
    tasks = build_tasks(e)
    active = int(count_params(c.model)["active"])
    setup = EvalSetup(agent_cfg=c.agent, tokenizer=tok, registry_fn=registry_fn_for(c), num_passes=int(e.num_passes),
                      max_parallel=int(e.max_parallel), backend=e.backend, verify_timeout_s=float(e.verify_timeout_s),
                      success_threshold=float(e.success_threshold), active_params=active,
                      system_prompt=system_prompt_for(c))
    print(f"{len(tasks)} tasks ({e.task_source}/{e.task_split}) x {e.num_passes} passes, backend {e.backend}, "
          f"active params {active:,}", flush=True)
    policies = checkpoint_list(c, a.checkpoint)
    records, per_task, overall, sources = [], [], [], {}
    key = jax.random.key(int(c.seed))
    for i, (name, path) in enumerate(policies):
        t0 = time.time()
        params, meta = load_params(path, c)
        sources[name] = meta
        pol = policy_from_params(params, c, jax.random.fold_in(key, 1000 + i), temperature=float(e.temperature),
                                 top_p=float(e.top_p))
        if e.warmup:   # compile the sampler's shape buckets outside the timed episodes
            ctx = np.asarray(tok.encode((setup.system_prompt or "") + tasks[0].prompt), np.int32)
            pol([ctx] * min(len(tasks) * int(e.num_passes), int(e.max_parallel)), int(c.agent.max_new_tokens))
        recs = run_eval(pol, tasks, setup, policy_name=name, log=lambda s: print(s, flush=True))
        rows, o = summarize(recs)
        o.update(checkpoint=path or "(init)", checkpoint_step=meta.get("step"), eval_wall_s=time.time() - t0)
        records += recs
        per_task += rows
        overall.append(o)
    if e.include_scripted:
        recs = run_eval(scripted_policy(tasks, tok), tasks, setup, policy_name="scripted")
        rows, o = summarize(recs)
        records += recs
        per_task += rows
        overall.append(o)
    write_jsonl(out / "records.jsonl", records)
    write_jsonl(out / "per_task.jsonl", per_task)
    write_jsonl(out / "summary.jsonl", overall)
    n = int(e.num_passes)
    cols = ["policy"] + [c2 for col in OVERALL_COLS for c2 in
                         ([f"best_of_{k}" for k in range(1, n + 1)] if col == "best_of_*" else [col])]
    task_cols = ["policy", "task_id", "accuracy"] + [f"best_of_{k}" for k in range(1, n + 1)] + [
        "completion_tokens", "tool_calls", "turns", "summaries", "latency_s", "flops"]
    md = (f"# Eval: {len(tasks)} tasks ({e.task_source}/{e.task_split}) x {n} passes\n\n"
          f"Checkpoints: {json.dumps({k: v for k, v in policies})}. best_of_K = unbiased pass@K; flops = "
          f"2 x {active:,} active params x processed tokens (see horizon.eval.harness).\n\n"
          + markdown_table(overall, cols) + "\n## Per task\n\n" + markdown_table(per_task, task_cols))
    (out / "results.md").write_text(md)
    best_of_k_plot(overall, out / "best_of_k.png")
    print("\n" + markdown_table(overall, cols))
    print(f"files: {out}/{{records.jsonl, per_task.jsonl, summary.jsonl, results.md, best_of_k.png, config.json}}")
    return overall


if __name__ == "__main__":
    main()
