"""Self-summarization learned by RL over long horizons (docs/SPEC.md §6; docs/RESULTS.md).

configs/selfsum_relay.py's key_relay made long: 12 logs (14 actions: key.txt, the logs, the answer),
four distractor memos ("memo #q", never needed) and a pin ("pin #P", in one of the first three logs)
that the answer needs only where the last log says "pin needed" (half the tasks): its importance shows
after several summaries were written (`horizon.tasks.key_recall`, "Long horizons").

SFT teaches the *format* of a memory, not its content: every demonstrator memory — self-summary,
compaction's facts section, the condenser's state section alike — keeps each key, the pin and
"pin needed" with probability `exp.sft.keep_prob` and each memo with `exp.sft.memo_keep_prob`
(`KeyRecallDemoPolicy`'s omission rule, in both SFT stages). Every fact written is a correct copy, so
the copy still forms; which facts to keep is what RL can learn from the chain's final reward.

experiments/selfsum.py runs it like the other studies, per seed: one shared SFT, then per strategy the
post-SFT eval, the oracle eval (the SFT policy with the demonstrator's perfect summaries injected:
`exp.oracle`), RL, the post-RL eval; every held-out episode of those evals is appended with its
provenance to the study's committed ledger (`exp.ledger`, `horizon.studies.ledger`), from which
`python experiments/results.py` rebuilds docs/RESULTS.md. `exp.triggers` adds runs at other compaction
triggers on the same SFT checkpoint (the post's 80k vs 40k: here 200 and 100 tokens).
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "selfsum_relay.py")
    e = c.exp
    e.task.update(dict(n_logs=12, log_lines=4, n_keys=3, slot_alphabets=True,
                       n_memos=4,          # distractors: look like facts, never needed
                       pin_prob=0.5))      # the pin: needed in half the tasks, shown only by the last log
    e.out_dir = "runs/selfsum_rl"
    e.strategies = ("self_summary", "prompt_compaction", "summarizing_condenser")
    e.oracle = True                   # per strategy, eval the SFT policy with perfect summaries injected
    e.study = "selfsum_rl"
    e.ledger = f"docs/results/{e.study}.jsonl"   # every eval episode appended (horizon.studies.ledger)
    e.triggers = ()                   # more compaction triggers, on the first seed only, from the same SFT
    e.steps = 20                      # RL steps per arm (~31 s each on 2 cores): 4 moved nothing on key_relay
    e.sft.keep_prob = 0.7             # each needed fact kept per demo memory (the omission rule above)
    e.sft.memo_keep_prob = 0.5        # each memo kept per demo memory
    e.sft.clean_keep_prob = 0.7       # stage 1's keep_prob (design A: the same rule in both stages; 1.0 = design B,
    #                                   every stage-1 answer a correct demonstration; docs/results/selfsum_rl.md)
    e.sft.corrupt_prob = 0.0          # no wrong letters: a written fact is always a correct copy
    e.sft.correct_finals_only = True  # stage 2 treats a wrong answer as stage 1 does (design C: left out whole)
    e.sft.final_mask = "letters"      # design D: answers slot-aligned, a lost key's slot a guess left out of the
    #                                   loss, the rest of the turn trained (C left out whole turns: the policy
    #                                   then looped instead of answering; docs/results/selfsum_rl.md)
    e.sft.clean_mix = ml_collections.ConfigDict(dict(
        a_short=dict(task=dict(n_logs=3, log_lines=1, n_memos=1), agent=dict(trigger_tokens=100)),
        b_full=dict(),
    ))
    # A compaction context holds the previous summary, a turn, the query and the new summary (~2 x 160
    # tokens + ~130): 480 cut its summary on this family and the chain looped on a lost "current" section.
    c.model.max_seq_len = 640
    c.agent.max_context_tokens = 600
    e.sft.seq_len = 640
    e.sft.clean_seq_len = 640
    c.agent.max_turns = 20            # 14 actions and room for malformed turns
    c.agent.max_total_tokens = 3072   # compaction summarizes after nearly every log (~130 tokens each)
    c.agent.summary_max_tokens = 48   # 3 keys, the pin, "pin needed" and 4 memos fit (~40 tokens)
    c.agent.compaction_max_tokens = 192
    c.agent.condenser_max_tokens = 128
    e.quick_overrides.exp.update(dict(n_sft_tasks=128, eval=dict(n_tasks=8, passes=2),
                                      ledger=""))   # quick rows go to <out_dir>/ledger.jsonl, not the committed one
    return c
