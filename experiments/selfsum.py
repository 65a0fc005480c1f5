"""Self-summarization vs its baselines, each trained as hard, over several seeds (docs/SPEC.md §6, §4).

    python experiments/selfsum.py --config=configs/selfsum_tiny.py                 # key_recall, 3 seeds
    python experiments/selfsum.py --config=configs/selfsum_relay.py                # key_relay: >= 2 summaries
    python experiments/selfsum.py --config=configs/selfsum_tiny.py --config.exp.quick=True   # exp.quick_overrides
    python experiments/selfsum.py --config=configs/selfsum_rl.py --config.exp.seeds="(0,)"  # RL's gain, one seed
    python experiments/results.py                                                           # docs/RESULTS.md

Task families: `horizon.tasks.key_recall` — read key.txt, then logs past the compaction trigger, so
the key's observation is gone when the answer is due; `key_relay` adds keys that arrive later, and
the answer is every key in order. Strategies (`exp.strategies`, horizon.agent.summarize):
self-summary, prompt compaction, an OpenHands-style summarizing condenser, observation masking,
sliding window.

Per seed of `exp.seeds` (out_dir/seed<k>/):
1. One shared SFT (`warmstart.two_stage_sft`, assistant tokens only) on `KeyRecallDemoPolicy` chains of
   every strategy, each with an equal share of trained tokens (`selfsum.balance_rows`): stage 1 its
   own correct chains (a compaction summary carries the key in its facts section, the condenser in
   its state section, masking in a note in the model's own turn), stage 2 the same share of lossy
   memories (`exp.sft.corrupt_prob`). Then the post-SFT copy checks, printed: each strategy's
   key-in-memory and answer-copy accuracy (teacher-forced, `selfsum.key_copy_check`).
2. RL per strategy from that checkpoint, same prompts, trigger, context limit, token budget and
   steps (`loop.run_rl`; rollouts and verification in the sandboxes of `exp.backend`).
3. Held-out eval at step 0 and at the end, per episode (`selfsum.study_eval`).
Then the table over all seeds (`selfsum.study_rows`, `horizon.studies.selfsum_metrics`): success with
its bootstrap CI, paired differences to self-summary per seed, compaction-caused errors, tokens per
summary, generated tokens per solved task, prefill tokens, summaries per episode.

Outputs in `exp.out_dir`: config.json, seed<k>/{metrics.jsonl, sft*, <strategy>/ckpt}, selfsum.md,
selfsum.png, summary.json (rows, copy checks per seed, wall times, provenance); TensorBoard events per seed and
strategy under seed<k>/ (`tensorboard --logdir <out_dir>`).
"""

from __future__ import annotations

import copy
import json
import sys
import time

import jax

from horizon.env.rollouts import SandboxPool
from horizon.inference import policy as engine_policy
from horizon.inference import sampler
from horizon.model import transformer
from horizon.rl.runtime import loop, warmstart, workers
from horizon.rl.runtime import memory as rlmemory
from horizon.studies import selfsum as ss
from horizon.studies import selfsum_runs as runs
from horizon.utils import cli
from horizon.utils.provenance import Provenance
from horizon.utils.seeds import run_keys


def load_config(argv=None):
    """The validated config of `argv` (exit 2 with one line on bad input); `exp.quick` applied first."""
    return cli.load(argv, default="configs/selfsum_tiny.py", validate=ss.validate_config, derive=ss.apply_quick,
                    doc=__doc__, prog="experiments/selfsum.py")


def policy_fn(c):
    """`loop.evaluate`'s policy: the rollout engine at fold_in(eval key, step)."""
    key = run_keys(c.seed)["eval"]
    return lambda params, step: engine_policy.rollout_policy(sampler.ParamsHolder(params, version=step), c,
                                                      jax.random.fold_in(key, step),
                                                      temperature=float(c.exp.eval.temperature))


def run_seed(c, stamp: dict) -> dict:
    """One seed: shared SFT, copy checks, then per arm (strategy x trigger, `selfsum_runs.arms`) the oracle
    eval where `exp.oracle`, RL with its step-0 and final evals, and the arm's ledger rows (module docstring)."""
    out, tok, log, family = loop.start_run(c)
    t0 = time.time()
    params = warmstart.two_stage_sft(transformer.init(run_keys(c.seed)["init"], c.model),
                                ss.warm_start_demos(family, c, tok), c, out, log, probe=ss.copy_probe(family, c, tok))
    t_sft = time.time() - t0
    chk = ss.key_copy_check(params, family, c, tok)
    log(dict(chk, phase="key_copy_check"))
    print(f"seed {c.seed}: post-SFT copy checks (teacher-forced key letter, clean held-out chains):\n  "
          + "\n  ".join(ss.copy_check_lines(chk, c.exp.strategies, float(c.exp.report.copy_threshold))), flush=True)
    heldout = family.tasks("heldout", int(c.exp.eval.n_tasks))
    pool = SandboxPool.from_config(c)
    arms, book = runs.arms(c, c.seed), runs.ledger_file(c)
    logged = lambda: ss.logged_results(out / "metrics.jsonl", c.seed, [a.name for a in arms], c.exp.steps)  # noqa: E731
    results, t_rl = logged(), {}                   # arms a killed run finished are not run again
    if results:
        print(f"seed {c.seed}: {sorted(results)} finished in an earlier run: their logged evals are reused", flush=True)
    try:
        for arm in [a for a in arms if a.name not in results]:
            t1 = time.time()
            rlmemory.release_compiled_if_near_limit(c, tag=f"{ss.run_tag(c.seed, arm.name)}: ")
            cs = runs.with_arm(c, arm)
            env = workers.family_env(cs, pool=pool)      # borrows the pool: every arm in the same sandboxes
            ev = ss.study_evaluator(env, heldout, cs, tok, strategy=arm.strategy, policy_fn=policy_fn(cs))
            oracle = (runs.oracle_eval(params, env, heldout, cs, tok, strategy=arm.strategy, policy_fn=policy_fn(cs))
                      if c.exp.get("oracle") else None)
            if oracle is not None:
                log(dict(oracle, phase="oracle_eval", run=ss.run_tag(c.seed, arm.name)))
                print(f"{ss.run_tag(c.seed, arm.name)}: oracle summaries {oracle['heldout_mean']:.3f} held-out "
                      f"({oracle['oracle_summaries']} summaries injected)", flush=True)
            loop.run_rl(params, env, cs, tok, out / arm.name, log, evaluate=ev, tag=f"{ss.run_tag(c.seed, arm.name)}: ")
            results[arm.name] = logged()[arm.name]       # a resumed run's step-0 eval is an earlier process's
            t_rl[arm.name] = time.time() - t1
        for arm in arms if book is not None else ():     # an arm finished here or by a killed run, recorded once
            n = runs.record_arm(c, arm, results[arm.name], book, stamp, command=" ".join(sys.argv),
                                run_wall_s=t_rl.get(arm.name))
            print(f"{ss.run_tag(c.seed, arm.name)}: {n} rows appended to {book}", flush=True)
    finally:
        pool.close()
        log.close()
    return dict(results={a.name: results[a.name] for a in arms}, copy_check=chk, sft_s=t_sft, rl_s=t_rl)


def main(argv=None):
    c = load_config(argv)
    prov, t_start = Provenance.start(c, seeds=c.exp.seeds), time.time()
    rlmemory.preflight(c, prog="experiments/selfsum.py")     # the RL step must fit before hours of SFT
    per_seed = {}
    for seed in c.exp.seeds:
        cs = copy.deepcopy(c)
        cs.seed = int(seed)
        cs.exp.out_dir = f"{c.exp.out_dir}/seed{seed}"
        per_seed[int(seed)] = run_seed(cs, prov.fields())
    out, _, log, _ = loop.start_run(c)
    log.close()
    rows = ss.study_rows({k: v["results"] for k, v in per_seed.items()}, c.exp.report)
    stamp = prov.fields()
    rows = {s: dict(r, provenance=stamp) for s, r in rows.items()}     # each study row carries its provenance
    wall = time.time() - t_start
    md = ss.table(rows, float(c.exp.report.ci_level))
    md += (f"\n{len(c.exp.seeds)} seed(s) x {c.exp.eval.n_tasks} held-out tasks x {c.exp.eval.passes} passes; "
           f"wall time {wall:.0f} s{' (exp.quick)' if c.exp.get('quick') else ''}\n")
    (out / "selfsum.md").write_text(md)
    (out / "summary.json").write_text(json.dumps(dict(
        rows=rows, wall_s=wall, quick=bool(c.exp.get("quick")), provenance=stamp,
        seeds={k: dict(copy_check=v["copy_check"], sft_s=v["sft_s"], rl_s=v["rl_s"]) for k, v in per_seed.items()}),
        indent=2))
    ss.plot(rows, out / "selfsum.png")
    print(md)
    print(f"outputs in {out}/: selfsum.md selfsum.png summary.json seed*/metrics.jsonl ({wall:.0f}s)")
    return dict(rows=rows, per_seed=per_seed, wall_s=wall)


if __name__ == "__main__":
    main(sys.argv[1:])
