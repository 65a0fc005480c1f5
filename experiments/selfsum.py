"""Self-summarization vs prompt compaction vs sliding window, trained with RL (SPEC §6, §4).

    python experiments/selfsum.py --config=configs/selfsum_tiny.py
    python experiments/selfsum.py --config=configs/selfsum_tiny.py --set exp.steps=2 --set exp.sft.steps=5

Task family: `horizon.tasks.key_recall` — read key.txt, then `exp.task.n_logs` logs (with decoy keys);
the context passes the compaction trigger after the last log, so the key's observation is
gone by the time the answer is due: it survives only in a summary.

1. Demonstrations: `DemoPolicy` chains for each strategy in `exp.strategies`, rolled out
   through the real agent loop (so every segment is what the policy will see); the final
   answer copies whatever key the context holds. Two-stage SFT (`loop.two_stage_sft`,
   assistant tokens only): clean chains of `exp.sft.clean_strategies` until the key copy
   forms, then the mixture of all strategies with a fraction `exp.sft.corrupt_prob` of lossy
   summaries (a wrong key: a decoy if the task has any, else another letter). Then
   `key_copy_check`: teacher-forced accuracy of the key's letter on clean held-out chains, per
   strategy, in summaries and answers (no sampling).
2. RL per strategy from that checkpoint, same prompts, trigger, token budget and steps
   (`horizon.rl.loop.run_rl`; rollouts and verification in Docker sandboxes): the final
   reward applies to every model token of the chain, summaries included (SPEC §6).
3. Held-out seeds, `exp.eval.passes` passes, at step 0 (SFT policy) and at the end (trained).

Outputs in `exp.out_dir`: config.json, metrics.jsonl (records tagged `run`), <strategy>/ckpt,
selfsum.md (the table), selfsum.png (success and summary tokens), summary.json.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from horizon.model import transformer
from horizon.rl import loop
from horizon.tasks import key_recall
from horizon.tasks.families import family_from_config, key_recall_demos
from horizon.utils.config import deep_merge

MIN_GAP_VS_WINDOW = 0.30     # the must-show: trained self-summary beats sliding window by >= 30 points


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/selfsum_tiny.py")
    p.add_argument("--out", default=None, help="run directory (default c.exp.out_dir)")
    p.add_argument("--set", action="append", default=[], metavar="a.b=VALUE", help="config override (JSON value)")
    return p.parse_args(argv)


def with_strategy(c, strategy: str):
    cs = copy.deepcopy(c)
    cs.agent.context_strategy = strategy
    return cs


def demo_rows(family, c, tok, strategies, corrupt_prob: float, tasks=None):
    """Demo segments for each of `strategies` on `tasks` (default: train seeds [0, n_sft_tasks),
    the same tasks for each strategy)."""
    from horizon.sandbox import open_sandbox

    tasks = family.tasks("train", int(c.exp.n_sft_tasks)) if tasks is None else tasks
    boxes = [open_sandbox(c.exp.demo_backend, "horizon-sandbox:base" if c.exp.demo_backend == "docker" else None)
             for _ in range(int(c.exp.demo_sandboxes))]
    try:
        rows = []
        for s in strategies:
            t0 = time.time()
            got = key_recall_demos(family, tasks, tok, with_strategy(c, s).agent, boxes, corrupt_prob=corrupt_prob,
                                   seed=int(c.seed), key_alphabet=str(c.exp.task.key_alphabet))
            print(f"demos {s} (lossy summaries {corrupt_prob:.2f}): {len(tasks)} chains -> {len(got)} segments "
                  f"({time.time() - t0:.0f}s)", flush=True)
            rows += got
        return rows
    finally:
        for b in boxes:
            b.close()


def stage1_configs(c) -> list:
    """One config per entry of `exp.sft.clean_mix`, the stage-1 curriculum (name -> overrides:
    ConfigDicts iterate in name order, and a tuple of dicts would not survive the trainer's
    FrozenConfigDict): each entry's `task` overrides merged over `exp.task` and its `agent`
    overrides over the agent section (an empty entry is the experiment's own chains). The mix
    spreads the distance from key.txt's observation to the summary, so that the lookup cannot
    key on the offset: learned on short chains only, the copy did not carry over to the full
    ones (docs/PERF.md)."""
    mixes = c.exp.sft.get("clean_mix") or ml_collections.ConfigDict(dict(full={}))
    if not isinstance(mixes, ml_collections.ConfigDict):
        raise ValueError(f"exp.sft.clean_mix must map names to {{task, agent}} overrides, got {type(mixes).__name__}")
    out = []
    for name, mix in mixes.items():
        unknown = set(mix.keys()) - {"task", "agent"}
        if unknown:
            raise ValueError(f"exp.sft.clean_mix.{name} has unknown keys {sorted(unknown)} (allowed: task, agent)")
        cs = copy.deepcopy(c)
        deep_merge(cs.exp.task, mix.get("task", {}))
        deep_merge(cs.agent, mix.get("agent", {}))
        out.append(cs)
    return out


def warm_start_demos(family, c, tok):
    """`loop.two_stage_sft`'s demos: stage 1 clean chains of `exp.sft.clean_strategies` on each
    of the stage-1 task sizes (`stage1_configs`), stage 2 all of `exp.strategies` on the
    experiment's tasks with `exp.sft.corrupt_prob` lossy summaries."""
    def demos(clean: bool):
        if clean:
            return [r for cs in stage1_configs(c) for r in
                    demo_rows(family_from_config(cs.exp), cs, tok, tuple(c.exp.sft.clean_strategies), 0.0)]
        return demo_rows(family, c, tok, tuple(c.exp.strategies), float(c.exp.sft.corrupt_prob))
    return demos


@functools.partial(jax.jit, static_argnames=("cfg",))
def _logits(params, tokens, *, cfg):
    return transformer.forward(params, tokens, cfg=cfg)[0]


def key_copy_check(params, family, c, tok) -> dict:
    """The SFT gate, without sampling or sandboxes: on clean demo chains of `exp.check_tasks`
    held-out tasks, the teacher-forced accuracy of the key's letter where the demonstrator writes
    them — in a summary (copied from key.txt's observation) and in the final answer (copied from
    the summary or the observation). Chance is 1/23 (~0.04); a policy that carries the key
    through a summary needs both near 1. Sliding-window finals are guesses and not scored."""
    tasks = family.tasks("heldout", int(c.exp.check_tasks))
    model_cfg = ml_collections.FrozenConfigDict(c.model)             # hashable: one compile per shape per run
    out = {}
    for s in c.exp.strategies:
        hits = {"summary": [], "final": []}
        for tokens, mask in demo_rows(family, c, tok, (s,), 0.0, tasks=tasks):
            text = tok.decode(tokens)
            m = key_recall.KEY_RE.search(text)
            if m is None:                                 # the window dropped the key: the answer is a guess
                continue
            pat = tok.encode(key_recall.KEY_MARK + m.group(1))
            n = len(tokens)
            padded = np.pad(np.asarray(tokens, np.int32), (0, -n % 128))[None]     # few shapes: few compiles
            pred = np.asarray(jnp.argmax(_logits(params, jnp.asarray(padded), cfg=model_cfg), -1))[0]
            for i in range(n - len(pat) + 1):
                if mask[i] and all(tokens[i + j] == pat[j] for j in range(len(pat))):
                    before = tok.decode(tokens[:i])
                    kind = "summary" if before.rfind("<summary>") > before.rfind("</summary>") else "final"
                    hits[kind] += [bool(pred[i + j - 1] == tokens[i + j]) for j in range(1, len(pat))]
        for kind, h in hits.items():
            if h:
                out[f"{s}_{kind}_key_acc"] = float(np.mean(h))
    return out


def copy_probe(family, c, tok):
    """The SFT probe (`loop.two_stage_sft`'s `probe`, every `exp.sft.probe_every` steps):
    `key_copy_check` of the stage-1 strategies on `exp.sft.probe_tasks` held-out chains of the
    experiment's own tasks, so the log shows when the copy forms (docs/PERF.md)."""
    cs = copy.deepcopy(c)
    cs.exp.check_tasks = int(c.exp.sft.get("probe_tasks", c.exp.check_tasks))
    cs.exp.strategies = tuple(c.exp.sft.clean_strategies)
    return lambda params: key_copy_check(params, family, cs, tok)


def table(results: dict, passes: int) -> str:
    head = ("| strategy | success, SFT policy | success, after RL | best-of-" + str(passes) +
            " after RL | generated tokens per solved task | summaries per episode | tokens per summary |\n"
            "|---|---|---|---|---|---|---|\n")

    def f(x, fmt="{:.3f}"):
        return "n/a" if x is None else fmt.format(x)

    rows = []
    for s, r in results.items():
        a, b = r["start"], r["end"]
        rows.append(f"| {s} | {f(a['heldout_mean'])} ± {f(a['heldout_std'])} | {f(b['heldout_mean'])} ± "
                    f"{f(b['heldout_std'])} | {f(b['heldout_best_of_k'])} | {f(b['eval_tokens_per_solved'], '{:.0f}')} "
                    f"| {f(b['eval_summaries'], '{:.2f}')} | {f(b['eval_tokens_per_summary'], '{:.0f}')} |")
    return head + "\n".join(rows) + "\n"


def plot(results: dict, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(results)
    x = np.arange(len(names))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for off, when, lab in ((-0.2, "start", "SFT policy"), (0.2, "end", "after RL")):
        a1.bar(x + off, [results[n][when]["heldout_mean"] for n in names], 0.4,
               yerr=[results[n][when]["heldout_std"] for n in names], capsize=3, label=lab)
    a1.set_xticks(x, names)
    a1.set_ylabel("held-out success")
    a1.set_ylim(0, 1.05)
    a1.legend()
    a1.set_title("key recall across compactions")
    a2.bar(x, [results[n]["end"]["eval_tokens_per_summary"] or 0 for n in names], 0.5)
    a2.set_xticks(x, names)
    a2.set_ylabel("tokens per summary (after RL)")
    a2.set_title("summary cost")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    a = parse_args(argv)
    t_start = time.time()
    c, out, tok, log, family = loop.start_run(a.config, a.set, a.out, env="key_recall")
    key = jax.random.key(int(c.seed))
    k_init, k_rl = jax.random.split(key)
    params = loop.two_stage_sft(transformer.init(k_init, c.model), warm_start_demos(family, c, tok), c, out, log,
                                probe=copy_probe(family, c, tok))
    t0 = time.time()
    chk = key_copy_check(params, family, c, tok)
    log(dict(chk, phase="key_copy_check", check_s=time.time() - t0))
    print("key copy check (teacher-forced key letter, clean held-out chains): "
          + ", ".join(f"{k} {v:.2f}" for k, v in chk.items()), flush=True)
    heldout = family.tasks("heldout", int(c.exp.eval.n_tasks))
    pool = loop.SandboxPool.from_config(c)
    results = {}
    try:
        for s in c.exp.strategies:
            cs = with_strategy(c, s)
            res = loop.run_rl(params, family, pool, cs, tok, out / s, log, k_rl, heldout, tag=f"{s}: ")
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
