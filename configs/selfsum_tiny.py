"""Self-summarization experiment (SPEC §6): configs/rl_tiny.py with the key-recall family.

experiments/selfsum.py SFTs one tiny policy on demonstration chains (two stages: clean
self-summary chains of several sizes until the key copy forms, then all three context strategies
on the full tasks with lossy summaries), then runs RL from it once per strategy with the same trigger,
token budget, prompts and steps, and evaluates each on held-out seeds. The model, agent and RL
sections are set here directly: the returned config is the one the run uses.

Sizes (byte tokens, `horizon.tasks.key_recall` with 3 logs of 3 lines and a one-letter key,
measured on 32 rendered demos): the key's observation sits 272 tokens before the summary. The
trigger (400) fires after the last log, so the key's observation is gone when the answer is
due unless a summary kept it: one summary per chain for both summarizing strategies — a
self-summary of 37 tokens vs a 10-section compaction of 250 (segments up to 806 tokens, hence
max_context 960) — while the sliding window keeps the last calls only and drops the key's
observation. Demo chains: 306 (self-summary), 519 (compaction), 392 (window) model tokens, all
under the 1536 budget.
"""

import ml_collections

from horizon.tasks import key_recall
from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "rl_tiny.py")
    e = c.exp
    e.env = "key_recall"
    e.task = ml_collections.ConfigDict(dict(
        n_logs=3, log_lines=3,
        n_decoys=0,                          # decoys ("old K revoked") would need the induction copy (key_recall docs)
        key_alphabet=key_recall.KEY_ALPHABET,  # one capital: a guess is right 1/23 of the time
    ))
    e.strategies = ("self_summary", "prompt_compaction", "sliding_window")
    e.out_dir = "runs/selfsum_tiny"
    e.steps = 12                      # RL steps per strategy
    e.n_sft_tasks = 1024              # demonstration chains per strategy (train seeds [0, n)); RL prompts follow
    e.demo_backend = "local"          # demos are the env's own `cat`s of generated files (no model output runs;
    #                                   a docker demo backend uses exp.sandbox_image)
    e.demo_sandboxes = 16
    # --- two-stage warm start (horizon.rl.runtime.loop.two_stage_sft)
    e.sft.clean_steps = 1200          # stage 1: correct chains of `clean_strategies` only, where the key copy forms
    #                                   (loss flat at ~2 letters at chance until step ~700, then the copy: 1.00 / 0.92
    #                                   key accuracy in summary / answer at 1200; at 600 it was 0.69, docs/PERF.md)
    e.sft.clean_strategies = ("self_summary",)   # the shortest chains that carry the copy (observation -> summary -> answer)
    # Stage-1 curriculum: clean chains of two sizes, key.txt's observation 86 and 272 tokens before the
    # summary (the second is the experiment's own chains), so the lookup cannot key on the distance.
    e.sft.clean_mix = ml_collections.ConfigDict(dict(   # name -> overrides, taken in name order
        a_short=dict(task=dict(n_logs=1, log_lines=1), agent=dict(trigger_tokens=200)),
        b_full=dict(),
    ))
    e.sft.clean_seq_len = 512         # self-summary segments are <= ~505 tokens: half-length rows, half the
    e.sft.clean_batch_size = 16       #   attention cost of 8 x 1024 (1.3 vs 3 s/step on 2 cores), same tokens/step
    e.sft.clean_lr = 1e-2             # stage 1 peak lr (cosine); the copy formed as it decayed, not at constant 1e-2
    e.sft.steps = 300                 # stage 2: every strategy, `corrupt_prob` lossy summaries
    e.sft.optim.lr = 2e-3             # stage 2 peak lr: at 1e-2 stage 2 undid the copy (summary 0.69 -> 0.08,
    #                                   docs/PERF.md); lower, it learns the other strategies' formats on top of it
    e.sft.batch_size = 8
    e.sft.seq_len = 1024              # demo segments (<= max_context_tokens + 1) packed into rows of this many tokens
    e.sft.corrupt_prob = 0.1          # lossy demo summaries: a decoy (none here: another letter) instead of the key
    #                                   (an SFT policy that imitates them loses the key in that share of summaries)
    e.sft.log_every = 50
    e.sft.probe_every = 200           # key-copy check (experiments/selfsum.py copy_probe) during both SFT stages
    e.sft.probe_tasks = 8             #   on this many held-out chains (~10 s per probe on 2 cores)
    e.check_tasks = 24                # held-out chains for the teacher-forced key copy check after SFT
    e.eval.n_tasks = 48
    e.eval.passes = 2
    e.eval.every = 0                  # evaluate at step 0 (the SFT policy) and at the end only
    c.model.max_seq_len = 1024
    c.model.remat = True              # RL chain batches reach 128 rows x 1024 tokens: without remat the trainer
    #                                   step needed a 27 GB buffer on CPU (docs/PERF.md)
    c.agent.update(dict(
        max_turns=12, max_new_tokens=64,  # summary turns count: compaction summarizes after every late log   # a read call is ~60 tokens, the final answer ~18
        max_total_tokens=1536,            # the same generated-token budget for every strategy
        max_context_tokens=960, trigger_tokens=400,   # room for the compaction query + its ~250-token summary
        summary_max_tokens=64, compaction_max_tokens=320,
        sliding_window_keep_fraction=0.75,
        summary_query=key_recall.SUMMARY_QUERY, compaction_prompt=key_recall.COMPACTION_QUERY,
        summary_header=key_recall.SUMMARY_HEADER, state_template=key_recall.STATE_TEMPLATE,
        include_file_listing=False, max_malformed_calls=2, num_tool_workers=8, tool_timeout_s=20.0,
        context_strategy="self_summary",  # replaced per run by each of exp.strategies
    ))
    c.rl.sampler.update(dict(min_batch_bucket=32, min_prompt_bucket=128, min_new_bucket=64))
    c.rl.batch.update(dict(min_rows=32, min_seq=256))
    return c
