"""Self-summarization experiment (docs/SPEC.md §6): configs/rl_tiny.py with the key-recall family.

experiments/selfsum.py, per seed of `exp.seeds`, SFTs one tiny policy on demonstration chains of
every strategy with an equal share of trained tokens each (two stages: correct chains of several
sizes until the key copy forms, then the full tasks with the same share of lossy memories), then
runs RL from it once per strategy with the same trigger, token budget, prompts and steps, and
evaluates each on held-out seeds. The model, agent and RL sections are set here
directly: the returned config is the one the run uses.

Tokens: the repo's BPE (envs/tokenizers/bpe1024.json, configs/rl_tiny_bpe.py), not bytes. It
halves every chain (2.0-2.1x on each strategy's demos, measured on 8 chains each) and keeps the key
letter its own token, so SFT rows of 512 hold what 1024 bytes did, at about a quarter of the
attention cost: the study's 2-hour budget needs it (docs/PERF.md). Every budget below is the byte
config's halved (but the condenser's summary: 96, see there), and the demonstrators behave as they
did at byte level (same summaries per chain, same successes; `KeyRecallDemoPolicy`, 8 train tasks):

| strategy | decoded tokens, max segment (short chains) | (the experiment's chains) |
|---|---|---|
| self_summary | 94, 145 | 158, 261 (1 summary) |
| prompt_compaction | 193, 309 | 263, 431 (1 summary) |
| summarizing_condenser | 134, 204 | 204, 326 (1 summary) |
| observation_masking | 90, 153 | 154, 256 (key noted in its own turn) |
| sliding_window | 77, 120 (1 of 8 right: the key's read is still in the window) | 141, 236 (0 of 8) |

The key's observation is gone when the answer is due unless a memory kept it: the trigger (200)
fires after the last log. (Measured before `agent.context_notes`, which adds 12-17 prompt tokens to every
segment: decoded tokens are unchanged; a masking chain now rewrites its context twice.)
"""

import pathlib

import ml_collections

from horizon.tasks import key_recall
from horizon.utils.config import sibling_config

BPE_FILE = pathlib.Path(__file__).resolve().parents[1] / "envs" / "tokenizers" / "bpe1024.json"


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
        copy_threshold=0.8,           # post-SFT key-in-summary every summarizing strategy should reach
    ))
    e.quick = False                   # True: merge quick_overrides below (a short run that shows the pipeline)
    e.quick_overrides = ml_collections.ConfigDict(dict(exp=dict(   # docs/PERF.md (`exp.quick`): with clean_key_weight
    #   10 (1498 s) the copy had not formed by stage-1 step 800 (key in memory 0.00 for every summarizer); with 30
    #   (now the default, e.sft.clean_key_weight below) every summarizer's was 1.00 after SFT, and with 4 RL steps
    #   quick took 1234 s (over its 20 minutes; 4 steps moved no strategy by more than 0.062 there): 2 RL steps.
    #   On a fresh compilation cache it took 1582 s, 962 s since the engine and train plans compile once
    #   (exp.warmup; docs/PERF.md "Studies at benchmark speed"): 591 s of that is the SFT phase
        seeds=(0,), n_sft_tasks=256, steps=2, check_tasks=8, eval=dict(n_tasks=16, passes=2),
        sft=dict(clean_steps=800, steps=100, probe_every=0),
    ), rl=dict(optim=dict(warmup_steps=1))))   # warmup must be shorter than the run (rl.runtime.checks)
    e.steps = 4                       # RL steps per strategy (~25 s each alone on 2 cores: the 2-hour budget, PERF.md)
    e.n_sft_tasks = 512               # demonstration chains per strategy (train seeds [0, n)); RL prompts follow
    e.demo_backend = "local"          # demos are the env's own `cat`s of generated files (no model output runs;
    #                                   a docker demo backend uses exp.sandbox_image)
    e.demo_sandboxes = 16
    # --- two-stage warm start (horizon.rl.runtime.warmstart.two_stage_sft)
    e.sft.clean_steps = 1200          # stage 1: correct chains of every strategy, an equal share of trained tokens each
    #                                   (env.selfsum.balance_rows), where the key copy forms. Scoping (benchmarks/
    #                                   selfsum_scope.py, docs/PERF.md): unweighted, 1200 steps formed it in no seed
    #                                   (2 tried); with clean_key_weight 10 it formed by step 800 in seeds 1 and 2
    #                                   (0.81, 0.94) and was forming at 1200 in seed 0 (0.38 in the self-summary).
    #                                   With agent.context_notes on (the committed study) it formed in no seed by
    #                                   1200, partly in stage 2 (0.04-0.75 after SFT): not yet reliable across seeds
    # Stage-1 curriculum: clean chains of two sizes (1 log of 1 line vs the experiment's own chains:
    # key.txt's observation 86 vs 272 byte tokens before the summary), so the lookup cannot key on the distance.
    e.sft.clean_mix = ml_collections.ConfigDict(dict(   # name -> overrides, taken in name order
        a_short=dict(task=dict(n_logs=1, log_lines=1), agent=dict(trigger_tokens=100)),
        b_full=dict(),
    ))
    e.sft.clean_seq_len = 512         # stage 1 holds every strategy: compaction segments reach 431 tokens (the table
    e.sft.clean_batch_size = 8        #   above); attention dominates the step (8 x 1024 byte rows cost 4x 32 x 256)
    e.sft.clean_key_weight = 30.0     # stage-1 loss weight of every strategy's key-letter tokens, alike for all
    #                                   (selfsum.weight_key_tokens): ~2% of the trained tokens are the copy; 1 = off.
    #                                   10 formed it by step 1200 in no seed with the context notes; 30 formed it
    #                                   in every seed (docs/PERF.md, the self-summarization study "each token
    #                                   trained once, key weight 30")
    e.sft.clean_lr = 1e-2             # stage 1 peak lr (cosine); the copy formed as it decayed, not at constant 1e-2
    e.sft.steps = 300                 # stage 2: every strategy, `corrupt_prob` lossy summaries
    e.sft.optim.lr = 2e-3             # stage 2 peak lr: at 1e-2 stage 2 undid the copy (summary 0.69 -> 0.08,
    #                                   docs/PERF.md); lower, it learns the other strategies' formats on top of it
    e.sft.batch_size = 8
    e.sft.seq_len = 512               # demo segments (<= max_context_tokens + 1) packed into rows of this many tokens
    e.sft.corrupt_prob = 0.1          # lossy demo summaries: a decoy (none here: another letter) instead of the key
    #                                   (an SFT policy that imitates them loses the key in that share of summaries)
    e.sft.remat = False               # SFT rows (8 x 512) fit without recompute (model.remat: the RL trainer's)
    e.sft.log_every = 50
    e.sft.probe_every = 200           # key-copy check (experiments/selfsum.py copy_probe) during both SFT stages
    e.sft.probe_tasks = 8             #   on this many held-out chains (~10 s per probe on 2 cores)
    e.check_tasks = 24                # held-out chains for the teacher-forced key copy check after SFT
    e.eval.n_tasks = 24               # x passes x seeds: 144 episodes per strategy in the table
    e.eval.passes = 2
    e.eval.every = 0                  # evaluate at step 0 (the SFT policy) and at the end only
    c.model.tokenizer = str(BPE_FILE)
    c.model.vocab_size = 1024
    c.model.max_seq_len = 512
    c.model.remat = False             # byte chains needed it (128 x 1024 rows: a 27 GB buffer on CPU, docs/PERF.md);
    #                                   BPE rows are half as long: 128 x 512 needs 7.09 GiB without remat, 3.55 GiB
    #                                   in micro-batches of 64 rows (benchmarks/rl_step_memory.py)
    c.agent.update(dict(
        max_turns=12, max_new_tokens=48,  # a read call is ~30 tokens, with a masking note ~40, the final answer ~9
        max_total_tokens=768,             # the same generated-token budget for every strategy
        max_context_tokens=480, trigger_tokens=200,   # room for the compaction query + its ~125-token summary
        summary_max_tokens=32, compaction_max_tokens=160,
        sliding_window_keep_fraction=0.75,
        summary_query=key_recall.SUMMARY_QUERY, compaction_prompt=key_recall.COMPACTION_QUERY,
        condenser_prompt=key_recall.CONDENSER_QUERY, observation_placeholder=key_recall.MASK_PLACEHOLDER,
        condenser_max_tokens=96, condenser_keep_first=0,   # key_relay's 4 sections reach ~85 (80 cut them)
        condenser_keep_recent_fraction=0.85,   # head + 4-section summary ~110 tokens: 0.85 x 200 keeps the last turn
        observation_masking_keep_recent=1,
        summary_header=key_recall.SUMMARY_HEADER, state_template=key_recall.STATE_TEMPLATE,
        context_notes=ml_collections.ConfigDict(key_recall.CONTEXT_NOTES),  # each strategy's regime, in its
        #   system prompt: without it a policy SFT'd on every strategy cannot tell at the first turn whether it
        #   runs under masking (it seldom wrote masking's first note; docs/PERF.md, the self-summarization
        #   study "the copy forms on the fair mix")
        include_file_listing=False, max_malformed_calls=2, num_tool_workers=8, tool_timeout_s=20.0,
        context_strategy="self_summary",  # replaced per run by each of exp.strategies
    ))
    c.rl.sampler.update(dict(min_batch_bucket=32, min_prompt_bucket=64, min_new_bucket=32,
                             # a bounded engine plan, compiled once up front (exp.warmup): windows 128/256/512,
                             # one prefill chunk, prefill rows 8/16/32, one decode chunk for RL and eval
                             # (horizon.inference.warmup.plan; docs/INFERENCE.md, "Compile once")
                             engine_window_per_octave=1, engine_min_window=128, engine_min_prefill_chunk=64,
                             engine_min_prefill_rows=8, sync_tokens=16))
    e.warmup = True
    c.rl.batch.update(dict(min_rows=32, min_seq=256,    # train lengths 256/512: one compile each (exp.warmup)
                           micro_rows=64))     # gradient accumulation over whole chains: memory bounded per pass
    return c
