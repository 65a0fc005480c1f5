"""What a self-summarization task family asks of a policy, measured with its demonstrator (no model).

    python benchmarks/selfsum_family.py --config=configs/selfsum_rl.py
    python benchmarks/selfsum_family.py --config=configs/selfsum_rl.py --config.agent.trigger_tokens=100

Per strategy of `exp.strategies`, on `exp.eval.n_tasks` held-out tasks in LocalSandboxes: the perfect
demonstrator's success, actions, summaries, generated tokens and weighted effort x per episode (the length
penalty's argument under `rl.length_penalty`, `horizon.env.rewards.effort`: what a penalty's scale is set
against, configs/sweeps/length_penalty.py) with the penalty it gets; the lossy demonstrator's
(the SFT demos' omission rule, `exp.sft.keep_prob` / `memo_keep_prob`) success and per-summary carry
of needed facts and memos (`selfsum_metrics.memory_carry`), and the oracle wrapper around it (perfect
summaries injected, `horizon.studies.oracle`). Also the tokens one episode holds without any rewrite,
against the trigger. These are the family's properties behind docs/RESULTS.md: >= 12 actions, several
rewrites, >= 4x the trigger, and the headroom a demonstrator's summaries leave.
"""

from __future__ import annotations

import sys

import ml_collections
import numpy as np

from horizon.agent import run_episodes
from horizon.data.tokenizer import tokenizer_from_config
from horizon.env import rewards
from horizon.env.demos import KeyRecallDemoPolicy
from horizon.env.families import family_from_config, make_episode
from horizon.sandbox import open_sandbox
from horizon.studies import gains
from horizon.studies import selfsum as ss
from horizon.studies import selfsum_metrics as sm
from horizon.studies.oracle import OracleSummaries
from horizon.tasks import verify
from horizon.utils import cli, provenance


def chains(c, tok, strategy: str, policy_of, box) -> list[dict]:
    """One demonstrator episode per held-out task: reward, actions, summaries, generated tokens, carry."""
    fam = family_from_config(c.exp)
    a = ml_collections.ConfigDict(c.agent.to_dict())
    a.context_strategy = strategy
    out = []
    for t in fam.tasks("heldout", int(c.exp.eval.n_tasks)):
        fam.reset(box, t)
        tr = run_episodes(policy_of(t.metadata["seed"]), [make_episode(fam, t, box, tok, a)])[0]
        carry = sm.memory_carry(ss.summary_pairs(tr.segments, tok), t.metadata["facts"],
                                t.metadata.get("distractors", ()))
        out.append(dict(carry, reward=verify(t, box, tr.final_answer, check_edits=False).reward,
                        actions=tr.stats["tool_calls"] + (tr.end_reason == "final"), summaries=tr.stats["summaries"],
                        generated=tr.num_generated_tokens, longest=max(len(s.tokens) for s in tr.segments),
                        effort=float(rewards.effort(tr.stats, c.rl.length_penalty)),
                        penalty=rewards.length_penalty(tr.stats, c.rl.length_penalty),
                        total=len(tr.segments[-1].tokens)))
    return out


def _carry(rows, kind):
    x = gains.carry(rows, kind)
    return "n/a" if x is None else f"{x:.2f}"


def main(argv=None):
    c = cli.load(argv, default="configs/selfsum_rl.py", validate=ss.validate_config, derive=ss.apply_quick,
                 doc=__doc__, prog="benchmarks/selfsum_family.py")
    provenance.announce(argv, config=c)
    tok = tokenizer_from_config(c)
    keep, memo = float(c.exp.sft.get("keep_prob", 1.0)), float(c.exp.sft.get("memo_keep_prob", 0.0))
    box = open_sandbox("local", None)
    try:
        whole = ml_collections.ConfigDict(c.to_dict())      # no rewrite: every turn stays in the context
        whole.agent.update(dict(max_context_tokens=8192, trigger_tokens=8000))
        whole.model.max_seq_len = 8192
        total = [r["total"] for r in chains(whole, tok, "self_summary", lambda s: KeyRecallDemoPolicy(tok), box)]
        print(f"tokens per episode without a rewrite: mean {np.mean(total):.0f}, min {min(total)} "
              f"= {min(total) / int(c.agent.trigger_tokens):.2f}x the trigger ({c.agent.trigger_tokens})")
        print(f"| strategy | perfect: success, actions, summaries, generated, longest segment, effort x (penalty) "
              f"| lossy (keep "
              f"{keep}, memo {memo}): success, needed carry, memo carry | oracle summaries over lossy: success |")
        print("|---|---|---|---|")
        for s in c.exp.strategies:
            p = chains(c, tok, s, lambda seed: KeyRecallDemoPolicy(tok), box)
            lossy = lambda seed: KeyRecallDemoPolicy(tok, 0.0, seed, keep_prob=keep, memo_keep_prob=memo)  # noqa: E731
            q = chains(c, tok, s, lossy, box)
            o = chains(c, tok, s, lambda seed, _l=lossy: OracleSummaries(_l(seed), tok), box)
            m = lambda rows, k: np.mean([r[k] for r in rows])  # noqa: E731
            print(f"| {s} | {m(p, 'reward'):.3f}, {m(p, 'actions'):.1f}, {m(p, 'summaries'):.1f}, "
                  f"{m(p, 'generated'):.0f}, {max(r['longest'] for r in p)}, {m(p, 'effort'):.1f} "
                  f"({m(p, 'penalty'):.4f}) | {m(q, 'reward'):.3f}, "
                  f"{_carry(q, 'needed')}, {_carry(q, 'distractors')} | {m(o, 'reward'):.3f} |", flush=True)
    finally:
        box.close()


if __name__ == "__main__":
    main(sys.argv[1:])
