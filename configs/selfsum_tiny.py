"""Self-summarization experiment (SPEC §6): configs/rl_tiny.py with the key-recall family.

experiments/selfsum.py, per seed of `exp.seeds`, SFTs one tiny policy on demonstration chains of
every strategy with an equal share of trained tokens each (two stages: correct chains of several
sizes until the key copy forms, then the full tasks with the same share of lossy memories), then
runs RL from it once per strategy with the same trigger, token budget, prompts and steps, and
evaluates each on held-out seeds (issue 25). The model, agent and RL sections are set here
directly: the returned config is the one the run uses.

Sizes (byte tokens, `horizon.tasks.key_recall` with 3 logs of 3 lines and a one-letter key,
measured on 32 rendered demos): the key's observation sits 272 tokens before the summary. The
trigger (400) fires after the last log, so the key's observation is gone when the answer is
due unless a summary kept it: one summary per chain for both summarizing strategies — a
self-summary of 37 tokens vs a 10-section compaction of 250 (segments up to 806 tokens, hence
max_context 960) — while the sliding window keeps the last calls only and drops the key's
observation. Demo chains: 306 (self-summary), 519 (compaction), 392 (window) model tokens, all
under the 1536 budget; the summarizing condenser keeps ~200 recent tokens after a 4-section
summary (406 model tokens), observation masking notes the key in its own turn (290 decoded tokens;
its kept turns are trained again in the second segment).
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
    e.strategies = ("self_summary", "prompt_compaction", "summarizing_condenser", "observation_masking",
                    "sliding_window")    # horizon.agent.summarize.STRATEGIES; self_summary is the paired baseline
    e.seeds = (0, 1, 2)               # one shared SFT per seed, then RL per strategy (out_dir/seed<k>/)
    e.out_dir = "runs/selfsum_tiny"
    e.report = ml_collections.ConfigDict(dict(
        bootstrap_samples=2000,       # replicates of the success CI (tasks resampled within each seed)
        ci_level=0.95,
        bootstrap_seed=0,
        copy_threshold=0.8,           # post-SFT key-in-summary every summarizing strategy should reach (issue 25)
    ))
    e.quick = False                   # True: merge quick_overrides below (a short run that shows the pipeline)
    e.quick_overrides = ml_collections.ConfigDict(dict(exp=dict(   # NOT timed yet: the scoping run sizes them
        seeds=(0,), n_sft_tasks=256, steps=4, check_tasks=8, eval=dict(n_tasks=16, passes=2),
        sft=dict(clean_steps=800, steps=100, probe_every=0),
    )))
    e.steps = 12                      # RL steps per strategy
    e.n_sft_tasks = 1024              # demonstration chains per strategy (train seeds [0, n)); RL prompts follow
    e.demo_backend = "local"          # demos are the env's own `cat`s of generated files (no model output runs;
    #                                   a docker demo backend uses exp.sandbox_image)
    e.demo_sandboxes = 16
    # --- two-stage warm start (horizon.rl.runtime.loop.two_stage_sft)
    e.sft.clean_steps = 1200          # stage 1: correct chains of every strategy, an equal share of trained tokens each
    #                                   (env.selfsum.balance_rows), where the key copy forms. With self-summary chains
    #                                   alone: loss flat until step ~700, then the copy (1.00 / 0.92 key accuracy in
    #                                   summary / answer at 1200; docs/PERF.md); the shared schedule is not measured yet
    # Stage-1 curriculum: clean chains of two sizes, key.txt's observation 86 and 272 tokens before the
    # summary (the second is the experiment's own chains), so the lookup cannot key on the distance.
    e.sft.clean_mix = ml_collections.ConfigDict(dict(   # name -> overrides, taken in name order
        a_short=dict(task=dict(n_logs=1, log_lines=1), agent=dict(trigger_tokens=200)),
        b_full=dict(),
    ))
    e.sft.clean_seq_len = 1024        # stage 1 now holds every strategy: compaction segments reach ~806 tokens (with
    e.sft.clean_batch_size = 8        #   self-summary alone 16 x 512 rows were 1.3 vs 3 s/step on 2 cores)
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
        max_turns=12, max_new_tokens=96,  # a read call is ~60 tokens, with a masking note ~82, the final answer ~18
        max_total_tokens=1536,            # the same generated-token budget for every strategy
        max_context_tokens=960, trigger_tokens=400,   # room for the compaction query + its ~250-token summary
        summary_max_tokens=64, compaction_max_tokens=320,
        sliding_window_keep_fraction=0.75,
        summary_query=key_recall.SUMMARY_QUERY, compaction_prompt=key_recall.COMPACTION_QUERY,
        condenser_prompt=key_recall.CONDENSER_QUERY, observation_placeholder=key_recall.MASK_PLACEHOLDER,
        condenser_max_tokens=160, condenser_keep_first=0,
        condenser_keep_recent_fraction=0.75,   # head + 4-section summary are ~190 tokens: 0.5 x 400 would keep no turn
        observation_masking_keep_recent=1,
        summary_header=key_recall.SUMMARY_HEADER, state_template=key_recall.STATE_TEMPLATE,
        include_file_listing=False, max_malformed_calls=2, num_tool_workers=8, tool_timeout_s=20.0,
        context_strategy="self_summary",  # replaced per run by each of exp.strategies
    ))
    c.rl.sampler.update(dict(min_batch_bucket=32, min_prompt_bucket=128, min_new_bucket=64))
    c.rl.batch.update(dict(min_rows=32, min_seq=256))
    return c
