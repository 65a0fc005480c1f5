"""Self-summarization vs prompt compaction vs sliding window, trained with RL (SPEC §6, §4).

    python experiments/selfsum.py --config=configs/selfsum_tiny.py
    python experiments/selfsum.py --config=configs/selfsum_tiny.py --config.exp.steps=2 --config.exp.sft.steps=5

Task family: `horizon.tasks.key_recall` — read key.txt, then `exp.task.n_logs` logs (with decoy keys);
the context passes the compaction trigger after the last log, so the key's observation is
gone by the time the answer is due: it survives only in a summary.

1. Demonstrations: `KeyRecallDemoPolicy` chains for each strategy in `exp.strategies`, rolled out
   through the real agent loop (so every segment is what the policy will see); the final
   answer copies whatever key the context holds. Two-stage SFT (`loop.two_stage_sft`,
   assistant tokens only): clean chains of `exp.sft.clean_strategies` until the key copy
   forms, then the mixture of all strategies with a fraction `exp.sft.corrupt_prob` of lossy
   summaries (a wrong key: a decoy if the task has any, else another letter). Then
   `key_copy_check`: teacher-forced accuracy of the key's letter on clean held-out chains, per
   strategy, in summaries and answers (no sampling).
2. RL per strategy from that checkpoint, same prompts, trigger, token budget and steps
   (`horizon.rl.runtime.loop.run_rl`; rollouts and verification in Docker sandboxes): the final
   reward applies to every model token of the chain, summaries included (SPEC §6).
3. Held-out seeds, `exp.eval.passes` passes, at step 0 (SFT policy) and at the end (trained).

Outputs in `exp.out_dir`: config.json, metrics.jsonl (records tagged `run`), <strategy>/ckpt,
selfsum.md (the table), selfsum.png (success and summary tokens), summary.json.
"""

from __future__ import annotations

import json
import sys
import time

from horizon.env.rollouts import SandboxPool
from horizon.env.selfsum import copy_probe, key_copy_check, plot, table, warm_start_demos, with_strategy
from horizon.model import transformer
from horizon.rl import checks
from horizon.rl.runtime import loop, workers
from horizon.utils import cli
from horizon.utils.seeds import run_keys

MIN_GAP_VS_WINDOW = 0.30     # the must-show: trained self-summary beats sliding window by >= 30 points


def load_config(argv=None):
    """The validated config of `argv` (exit 2 with one line on bad input)."""
    return cli.load(argv, default="configs/selfsum_tiny.py", validate=lambda c: checks.validate_experiment(
        c, "key_recall"), doc=__doc__, prog="experiments/selfsum.py")


def main(argv=None):
    c = load_config(argv)
    t_start = time.time()
    out, tok, log, family = loop.start_run(c)
    params = loop.two_stage_sft(transformer.init(run_keys(c.seed)["init"], c.model), warm_start_demos(family, c, tok), c, out, log,
                                probe=copy_probe(family, c, tok))
    t0 = time.time()
    chk = key_copy_check(params, family, c, tok)
    log(dict(chk, phase="key_copy_check", check_s=time.time() - t0))
    print("key copy check (teacher-forced key letter, clean held-out chains): "
          + ", ".join(f"{k} {v:.2f}" for k, v in chk.items()), flush=True)
    heldout = family.tasks("heldout", int(c.exp.eval.n_tasks))
    pool = SandboxPool.from_config(c)
    results = {}
    try:
        for s in c.exp.strategies:
            cs = with_strategy(c, s)
            env = workers.family_env(cs, pool=pool)      # borrows the pool: every strategy in the same sandboxes
            res = loop.run_rl(params, env, cs, tok, out / s, log, evaluate=loop.heldout_evaluator(env, heldout, cs, tok),
                              tag=f"{s}: ")
            ev = res["evals"]
            results[s] = {"start": ev[min(ev)], "end": ev[max(ev)]}
    finally:
        pool.close()
    md = table(results, int(c.exp.eval.passes))
    ss, pc, sw = (results.get(k) for k in ("self_summary", "prompt_compaction", "sliding_window"))
    checks = {}
    if ss and sw:
        gap = ss["end"]["heldout_mean"] - sw["end"]["heldout_mean"]
        checks["self_summary_minus_sliding_window"] = gap
        checks["gap_at_least_30_points"] = bool(gap >= MIN_GAP_VS_WINDOW)
    if ss and pc:
        ts, tp = ss["end"]["eval_tokens_per_summary"], pc["end"]["eval_tokens_per_summary"]
        checks["tokens_per_summary"] = {"self_summary": ts, "prompt_compaction": tp}
        checks["self_summary_fewer_summary_tokens"] = bool(ts is not None and tp is not None and ts < tp)
    md += "\n" + "\n".join(f"- {k}: {v}" for k, v in checks.items()) + "\n"
    (out / "selfsum.md").write_text(md)
    (out / "summary.json").write_text(json.dumps(dict(results=results, checks=checks,
                                                      wall_s=time.time() - t_start), indent=2))
    plot(results, out / "selfsum.png")
    log.close()
    print(md)
    print(f"outputs in {out}/: selfsum.md selfsum.png summary.json metrics.jsonl ({time.time() - t_start:.0f}s)")
    return dict(results=results, checks=checks)


if __name__ == "__main__":
    main(sys.argv[1:])
