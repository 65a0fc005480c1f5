"""SFT warm start + RL over agent rollouts in Docker sandboxes, on CPU (SPEC §4, §6, §7).

    python experiments/rl.py --config=configs/rl_tiny.py            # the demo (`make run`)
    python experiments/rl.py --config=configs/rl_tiny_bpe.py        # the same with a BPE tokenizer
    python experiments/rl.py --config=configs/rl_tiny.py --config.model.init_from=HF_CHECKPOINT_DIR

Environment. A byte-level tiny model cannot solve the hand-written task set, so the demo
trains on a procedurally generated family (`horizon.tasks.synthetic`): "In settings.py set
TIMEOUT to 17." (the file has TIMEOUT = 42 among 2-4 constants) solved by ONE call of the env's compact tool
`<function=set><parameter=value>17</parameter><parameter=name>TIMEOUT</parameter></function>`
(SPEC §5 per-environment tool sets: executed for real in the sandbox, one exec), whose two
arguments are copied from the prompt; a fast `python3 -B -c` check is the verifier. Held-out
tasks are unseen seeds of the same family; the env has its own short system prompt (`synthetic.SYSTEM_PROMPT`).

Pipeline.
1. SFT: scripted solutions rendered in the exact agent prompt format
   (`horizon.agent.prompt.render`), loss on assistant tokens only (`horizon.train.lm.train_step`).
   Two stages (`loop.config_edit_warm_start`): `exp.sft.clean_steps` on correct demos (the
   tiny model learns to copy the value), then `exp.sft.steps` where a fraction
   `exp.sft.corrupt_prob` of demos carries the demonstrator's off-by-one value, so the SFT
   policy emits well-formed calls but mixes right and wrong values: RL has headroom. After SFT a
   sandbox-free check (`sft_check`: greedy and sampled decodes of the held-out prompts,
   parsed) logs the fraction of well-formed calls, the gate for RL to have any signal.
2. RL: each step takes `prompts_per_step` unseen train prompts (single epoch,
   `horizon.rl.runtime.prompts.PromptSampler`), `group_size` rollouts each, batched generation through
   `horizon.rl.rollout.sampler.make_policy`, tool calls and verification in a pool of reused Docker
   sandboxes (one exec resets a sandbox), reward = `rewards.total_reward` (verifier + length penalty),
   then `build_batch` -> `train_step` (Dr.GRPO, KL k1 in the reward, router replay), one compile.
3. Eval: at step 0, every `exp.eval.every` steps and at the end, `exp.eval.passes` sampled passes over
   `exp.eval.n_tasks` held-out tasks (std over passes = eval noise; best-of-K = solved by any pass).

Bad config values stop in one line, exit code 2, before anything starts (`model.init_from`: an HF
checkpoint dir's architecture, weights and tokenizer.json, `hf_import.apply_init_from`). Outputs in `exp.out_dir`:
config.json, metrics.jsonl (one record per SFT log / RL step / eval, `phase` field), orbax
checkpoints (sft/ and ckpt/ = RLState + prompt-sampler state; a rerun resumes from the latest),
rewards.png (mean and best-of-K vs step, train and held-out) and summary.json (must-show numbers).
"""

from __future__ import annotations

import json
import sys
import time

import jax
import numpy as np

from horizon.agent.prompt import Message, render, task_text
from horizon.model import hf_import
from horizon.rl import checks
from horizon.rl.rollout import sampler
from horizon.rl.runtime import loop, workers
from horizon.tools.format import tool_format
from horizon.utils import cli
from horizon.utils.seeds import run_keys


def load_config(argv=None):
    """The validated config of `argv` (exit 2 with one line on bad input)."""
    return cli.load(argv, default="configs/rl_tiny.py", validate=lambda c: checks.validate_experiment(c, "config_edit"),
                    derive=hf_import.apply_init_from, doc=__doc__, prog="experiments/rl.py")


def sft_check(params, family, tasks, c, tok, key) -> dict:
    """Greedy and sampled decodes on held-out prompts, parsed without a sandbox: the fraction of
    well-formed calls and of exactly right arguments (the SFT gate; no tool execution)."""
    ctx = [render([Message("system", family.system_prompt, kind="system"), Message("user", task_text(t))], tok,
                  add_generation_prompt=True).tokens for t in tasks]
    out = {}
    for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
        kw = dict(sampler.sampler_kwargs_from_config(c), temperature=temp)
        n = int(c.exp.pool_size)             # chunks shaped like the rollout batches: no extra compile
        gen = [g for i in range(0, len(ctx), n) for g in sampler.generate(
            params, ctx[i:i + n], jax.random.fold_in(key, i), cfg=c, max_new_tokens=int(c.agent.max_new_tokens),
            **kw).tokens]
        acts = [tool_format(c.agent.tool_format).parse_action(tok.decode(g)) for g in gen]
        ok = [getattr(a, "kind", "") == "call" and a.name == t.solution[0]["name"] for a, t in zip(acts, tasks)]
        out[f"{name}_wellformed"] = float(np.mean(ok))
        for arg in tasks[0].solution[0]["args"]:
            out[f"{name}_{arg}_correct"] = float(np.mean([o and a.args.get(arg) == t.solution[0]["args"][arg]
                                                          for o, a, t in zip(ok, acts, tasks)]))
        out[f"{name}_correct"] = float(np.mean([o and a.args == t.solution[0]["args"]
                                                for o, a, t in zip(ok, acts, tasks)]))
        out[f"{name}_example"] = tok.decode(gen[0])
    return out


def plot(records, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = [r for r in records if r.get("phase") == "rl"]
    ev = [r for r in records if r.get("phase") == "eval"]
    fig, ax = plt.subplots(figsize=(6, 4))
    if rl:
        s = [r["step"] for r in rl]
        ax.plot(s, [r["reward_mean"] for r in rl], ".-", alpha=0.5, label="train reward (mean)")
        ax.plot(s, [r["best_of_k"] for r in rl], ".-", alpha=0.5, label=f"train best-of-{rl[0]['group_size']}")
    if ev:
        s = [r["step"] for r in ev]
        ax.errorbar(s, [r["heldout_mean"] for r in ev], yerr=[r["heldout_std"] for r in ev], fmt="o-", capsize=3,
                    label="held-out success (mean ± std over passes)")
        ax.plot(s, [r["heldout_best_of_k"] for r in ev], "s--", label=f"held-out best-of-{len(ev[0]['heldout_passes'])}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward / success")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("RL on synthetic config-edit tasks (Docker sandboxes, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    c = load_config(argv)
    t_start = time.time()
    out, tok, log, family = loop.start_run(c)
    keys = run_keys(c.seed)
    env = workers.family_env(c)
    print(f"{len(env.pool.boxes)} {c.exp.backend} sandboxes ready ({time.time() - t_start:.0f}s)", flush=True)
    try:
        params = loop.config_edit_warm_start(c, family, tok, out, log, keys["init"])
        heldout = family.tasks("heldout", int(c.exp.eval.n_tasks))
        if not (out / "ckpt").is_dir():
            t0 = time.time()
            chk = dict(sft_check(params, family, heldout, c, tok, keys["check"]), phase="sft_check")
            log(dict(chk, check_s=time.time() - t0))
            print(f"SFT check on {len(heldout)} held-out prompts: well-formed greedy {chk['greedy_wellformed']:.2f} "
                  f"sampled {chk['sampled_wellformed']:.2f}; correct greedy {chk['greedy_correct']:.2f} sampled "
                  f"{chk['sampled_correct']:.2f} (no sandbox); e.g. {chk['greedy_example']!r}", flush=True)
        res = loop.run_rl(params, env, c, tok, out, log, evaluate=loop.heldout_evaluator(env, heldout, c, tok))
    finally:
        env.close()
    summary = dict(loop.gain_summary(res["evals"], log.records), wall_s=time.time() - t_start)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if c.exp.plot:
        plot(log.records, out / "rewards.png")
    log.close()
    print("summary:", json.dumps(summary))
    print(f"outputs in {out}/: config.json metrics.jsonl summary.json" + (" rewards.png" if c.exp.plot else "")
          + " sft/ ckpt/", flush=True)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
