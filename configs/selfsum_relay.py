"""The harder self-summarization family (docs/SPEC.md §6): configs/selfsum_tiny.py with `key_relay` tasks.

Three keys arrive at different times — key.txt, then "key #Z" lines in 4.log and 8.log
(`key_recall.late_key_logs`) — and the answer is every key in order ("#Q #Z #B", exact match).
With the same trigger (200 BPE tokens) and the context notes, a self-summary demo chain reads key.txt
and two logs, summarizes (key 1), reads three more (key 2 in 4.log), summarizes again (keys 1 and 2:
the second summary must carry forward what the first held), reads the last three (key 3 in 8.log),
summarizes a third time (all three) and answers: three summaries, four segments, on each of 32
train chains (tests/tasks/test_key_relay.py pins >= 2 for each summarizing strategy's demonstrator).
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "selfsum_tiny.py")
    e = c.exp
    e.env = "key_relay"
    e.task.update(dict(n_logs=8, n_keys=3,
                       slot_alphabets=True))   # key i from the i-th third of the alphabet: with one shared
    #   alphabet the middle slot of the 3-key summary was 0.14 after 1000 stage-1 steps (an ordered merge, not a
    #   lookup; docs/PERF.md); each slot is now the single-key lookup, the carry forward still needed
    e.out_dir = "runs/selfsum_relay"
    # Observation masking is not in the relay study: its own turns (reads and key notes) are what fill the
    # context here, and its demonstrator ends every chain at the context limit (16 of 16 train chains
    # `context_full`, segments of 599 tokens > the 512-token SFT rows; docs/PERF.md). It has no correct
    # demonstration to train on; tests/tasks/test_key_relay.py pins that it cannot solve the family.
    e.strategies = ("self_summary", "prompt_compaction", "summarizing_condenser", "sliding_window")
    # the stage-1 curriculum's short chains: the 3 keys over 2 logs, two summaries (the copy forms there first)
    e.sft.clean_mix = ml_collections.ConfigDict(dict(
        a_short=dict(task=dict(n_logs=2, log_lines=1), agent=dict(trigger_tokens=100)),   # 3 keys: same slots
        b_full=dict(),
    ))
    # stage 1 on the 4-strategy mix: each strategy gets a quarter of the tokens, and the tiny config's 1200 steps
    # left key in memory at the guess for every summarizer. 2400 formed it in seeds 0 and 1; in seed 2 the first
    # key's slot, carried through every summary, was still forming (docs/PERF.md "Self-summarization study, the
    # harder family with four strategies")
    e.sft.clean_steps = 2400
    e.sft.probe_every = 400           # the copy probe every 400 steps of both stages (~13 s each, seed 2's log)
    e.sft.clean_key_weight = 10.0     # key_relay's copy after SFT was better at 10 than at key_recall's 30, and
    #                                   with slot_alphabets it passes the copy gate at 10 (docs/PERF.md
    #                                   "Self-summarization study, the harder family")
    c.agent.max_turns = 16            # 9 reads + the answer, and room for malformed turns
    c.agent.max_total_tokens = 1536   # 2 x the key_recall budget: five more reads; prompt compaction summarizes after
    #                                   nearly every log (its ~130-token summary leaves the context near the trigger)
    return c
