"""`make run`'s config: SFT warm start + RL on the config-edit family in Docker (docs/SPEC.md §4, §6, §7).

The complete config experiments/rl.py runs: `model` (configs/tiny.py at max_seq_len 256), `mesh`,
`agent` (configs/agent_tiny.py with this environment's settings), `rl` (every RL hyperparameter:
loss/KL semantics in `horizon.rl.algo.losses`, the length penalty and behaviour hooks in
`horizon.env.rewards`) and `exp` (task family, sandboxes, SFT warm start, eval). What you read here
is what runs: `--config.rl.group_size=8` is the group size the trainer sees.

One RL step count: `exp.steps` (`rl.optim.steps`, the schedule length, is the same FieldReference,
so overriding either sets both).
"""

import ml_collections

from horizon.utils.config import sibling_config
from horizon.utils.tracking import tracking_fields


def rl_config() -> ml_collections.ConfigDict:
    r = ml_collections.ConfigDict()
    r.group_size = 4              # rollouts (or summary chains) per prompt, fixed
    # --- policy gradient (horizon.rl.algo.losses.policy_gradient_loss)
    r.loss_agg = "token_sum"      # "token_sum" (Dr.GRPO, no length norm) | "seq_mean" | "token_mean"
    r.token_sum_norm = 0.0        # divisor for token_sum; 0 = number of rows (a batch constant)
    r.std_normalize = False       # divide advantages by group std (GRPO ablation; report: off)
    r.std_unbiased = True         # with std_normalize: unbiased group std (ddof=1, verl/TRL); False = population
    r.adv_std_eps = 1e-6          # only used with std_normalize
    r.clip_eps = 0.0              # PPO ratio clip; 0 / None = off
    r.overlong_mask = False       # drop truncated rollouts from the loss (ablation; report: off)
    # --- KL(q||p) to the reference policy
    r.kl_coef = 1e-3              # beta; 0 disables (no reference forward needed)
    r.kl_estimator = "k1"         # "k1" (report) | "k2" | "k3"
    r.kl_mode = "reward"          # "reward" (detached reward-to-go in the advantage; unbiased with k1)
    #                               | "reward_token" (per-token penalty) | "loss" (naive term, ablation)
    r.kl_across_segments = True   # "reward" mode: charge a chain segment the KL of later segments too
    # --- stale-token corrections (docs/SPEC.md §4; horizon.rl.algo.losses): caps c > 1 on the detached
    #     ratio r = exp(logp_trainer - logp_sampler) of each loss token; 0 = off. Off by default: the report
    #     trains near on-policy (async_.max_staleness bounds the lag; the surrogate's r importance-weights
    #     every token already), and off keeps every existing run's loss and update bit-identical
    r.stale = ml_collections.ConfigDict(dict(
        tis_cap=0.0,              # truncated IS: weight min(r, c) in place of r (verl's tis_imp_ratio_cap)
        token_mask_cap=0.0,       # a token with r outside [1/c, c] gets no policy-gradient loss
        seq_mask_cap=0.0,         # a row whose geometric-mean r over its loss tokens is outside [1/c, c]: dropped
    ))                            # (masked tokens still count in the loss_agg denominator)
    # --- nonlinear length penalty: scale * f(x; k, q), x = weighted effort
    lp = ml_collections.ConfigDict()
    lp.enabled = True
    lp.k = 1e-3                   # bend point ~ 1/k effort units
    lp.q = 0.5                    # curvature: 0 linear, (0,1) power, 1 log, >1 saturating
    lp.scale = 2e-5               # penalty ≈ 0.09 at x = 1e4 (k, q above)
    lp.weights = ml_collections.ConfigDict(dict(
        thinking=1.0,             # per thinking token
        tool_call=1.0,            # per tool-call token
        tool_output=0.25,         # per tool-output token (not generated, but costs context/latency)
        final=1.0,                # per final-message token
        tool_calls=50.0,          # per tool call (round-trip latency)
        turns=20.0,               # per turn
    ))
    r.length_penalty = lp
    # --- behaviour reward weights (horizon.env.rewards.BEHAVIOUR_HOOKS; hooks are signed)
    r.behaviour = ml_collections.ConfigDict(dict(
        unfinished_todos=0.05,    # per todo created and not completed
        malformed_calls=0.02,     # per malformed tool call
    ))
    return r


def get_config() -> ml_collections.ConfigDict:
    base = sibling_config(__file__, "tiny.py")
    c = ml_collections.ConfigDict()
    c.seed = 0                        # every PRNG key of the run derives from it (horizon.utils.seeds)
    c.model = base.model
    c.model.max_seq_len = 256         # context ~95 tokens + call ~100
    c.mesh = base.mesh
    c.agent = sibling_config(__file__, "agent_tiny.py").agent
    c.agent.update(dict(
        max_turns=1,                  # one call ends the episode (end reason "max_turns", not truncated)
        max_new_tokens=112,           # the call is ~90 bytes
        max_context_tokens=240, trigger_tokens=200, context_strategy="none",
        include_file_listing=False,   # the prompt names the file; saves one exec per episode
        max_malformed_calls=1, num_tool_workers=8, tool_timeout_s=20.0,
    ))
    c.rl = rl_config()
    add_trainer_fields(c.rl)
    r = c.rl
    r.group_size = 4
    r.prompts_per_step = 8
    # one fixed-format call: the length penalty has nothing to trade off here, and in groups whose
    # rollouts all fail it would be the only (noise) signal, which Adam rescales to full-size steps
    r.length_penalty.enabled = False
    r.sampler.update(dict(min_batch_bucket=32, min_prompt_bucket=128, min_new_bucket=128))
    r.batch.update(dict(min_rows=32, min_seq=256))
    r.optim.update(dict(lr=2e-4, warmup_steps=2, min_lr_ratio=1.0))
    c.exp = experiment_config()
    r.optim.steps = c.exp.get_ref("steps")   # the schedule spans exactly the run's RL steps
    return c


# ============================================================================= RL trainer block
# Read by horizon.inference.sampler, horizon.rl.algo.{batch,trainer} and horizon.rl.runtime.{core,prompts}.
def add_trainer_fields(r: ml_collections.ConfigDict) -> None:
    # --- sampling (the rollout engine below; the fixed-batch horizon.inference.sampler.generate of
    #     benchmarks and tests reads the same section); logprobs are always the untempered model's
    r.sampler = ml_collections.ConfigDict(dict(
        temperature=1.0,          # 0 = greedy; != 1 makes samples off-policy w.r.t. the trained logprobs
        top_p=1.0,                # nucleus mass; 1 = full distribution
        min_batch_bucket=1,       # `generate`'s compile-shape buckets (powers of two >= these; the engine's
        #                           are its engine_* fields)
        min_prompt_bucket=64,
        min_new_bucket=32,
        chunk_tokens=16,          # decode steps between weight polls (in-flight updates, docs/SPEC.md §4.1; with
        #                           weights that do not change, any value gives the same samples)
        kv_mode="keep",           # at a weight switch: "keep" the old KV cache | "recompute" the prefill
        sync_tokens=32,           # decode steps per device chunk / host sync (without in-flight polling;
        #                           with it, chunk_tokens); benchmarks/sampling.py measures the trade-off; 32 beat
        #                           16 in the engine's raw workload (docs/PERF.md "Decode step, prefill and
        #                           the old-path baseline")
        # --- rollout engine (horizon.inference.engine: continuous batching, KV reuse across turns,
        #     shared prefixes; `EnginePolicy`), through which the RL loops, async workers and evals
        #     sample (`policy.rollout_policy`; sharded over a multi-device mesh). Cache budget =
        #     engine_slots x engine_max_len positions; past it requests queue (FIFO) and idle episode
        #     caches are swapped out, then dropped
        engine_slots=32,          # decode slots (rows of the latent cache; on a mesh a multiple of its
        #                           data*fsdp*expert ranks, over which the slot cache is split)
        engine_max_len=0,         # positions per slot; 0 = model.max_seq_len
        engine_prefill_chunk=64,  # max prefill tokens per row per call (long prompts: several chunks; 64 beat 128
        #                           on tiny: less padding, benchmarks/rollout_engine.py)
        engine_min_prefill_chunk=16,  # smallest prefill chunk (power-of-two compile buckets up to the max)
        engine_min_prefill_rows=1,    # smallest row count of a prefill call (power-of-two buckets up to the slots;
        #                           every (rows, chunk, window) is one compile: horizon.inference.warmup.plan)
        engine_min_window=64,     # smallest attention window (compile buckets above it, up to max_len)
        engine_window_per_octave=4,  # window buckets per doubling (a power of two): 1 = powers of two, 2 adds the
        #                           1.5x midpoints, 4 = steps of 1/8 of the power (a window <= 1.25x the positions
        #                           in use, for 4x the compiles of powers of two; benchmarks/rollout_engine.py)
        engine_min_reuse=16,      # shortest prefix hit copied from another slot / the swap store (a shorter one,
        #                           e.g. two prompts sharing a first token, is prefilled: a copy would cost more)
        engine_park_tokens=-1,    # swap store for evicted idle episode caches, positions; -1 = slots x max_len
        engine_stop_slots=4,      # max stop ids per request (width of the on-device stop table)
        engine_refill_slots=4,    # while requests wait, a decode chunk ends once this many slots finished (their
        #                           refill: one prefill call); 1 = refill each at once (benchmarks/rollout_engine.py)
        engine_replicas=1,        # data-parallel engine replicas, one per local device, engine_slots split over
        #                           them (engine.EngineReplicas); on CPU the process needs that many devices
        #                           (jax_num_cpu_devices): 2 on 2 cores ran the raw workload 1.2-1.3x faster
        #                           (docs/PERF.md)
        # --- where rollouts are sampled (docs/SERVING.md): "engine" = the in-process engine above; "remote" =
        #     any OpenAI-compatible endpoint at base_url (horizon's experiments/serve.py, vLLM, SGLang), sent
        #     token-id prompts, the turn's key as its seed (inference.remote.RemotePolicy)
        backend="engine",
        base_url="http://127.0.0.1:8000/v1",
        remote_model="",          # the served model's id ("" = the server's own)
        remote_concurrency=64,    # requests in flight at once
        remote_timeout_s=600.0,
        remote_retries=4,         # a connection error or 5xx retried this often (doubling waits), then an error
        remote_expert_ids=True,   # ask for the routed experts of every token (horizon's server; router replay)
        # --- the sampler's numerics, where they differ from the trainer's as an inference engine's do
        #     (sampler.sampler_numerics; the router-replay study, configs/sweeps/router_replay.py)
        compute_dtype="",         # the engine's compute dtype ("" = model.dtype; "bfloat16": a bf16 engine)
        router_noise=0.0,         # std of deterministic per-token noise on the engine's router logits (0 = none)
    ))
    # --- batch layout (horizon.rl.algo.batch.build_batch)
    r.batch = ml_collections.ConfigDict(dict(
        min_rows=8,               # row bucket minimum (rows = segments of all chains)
        min_seq=64,               # sequence bucket minimum
        min_groups=1,
        micro_rows=0,             # > 0: gradient accumulation over micro-batches of this many rows (whole
        #                           chains each; activation memory scales with it, not with the batch)
        truncated_reasons=("token_budget", "context_full", "max_steps"),  # agent end reasons = truncated
    ))
    # --- pre-run memory check (horizon.rl.runtime.memory; experiments/rl.py, before sandboxes, SFT and evals): XLA's
    #     memory of the train step compiled for the largest batch the run can produce (prompts_per_step x
    #     group_size chains of the most segments, agent.max_context_tokens long), vs the machine's
    r.memory_check = ml_collections.ConfigDict(dict(
        enabled=True,             # False = skip (the run may then die at its first train step)
        fraction=0.8,             # share of the available memory the step may take (the rest: rollout engine
        #                           caches, Python, sandboxes' host side)
        budget_gib=0.0,           # memory to compare with, GiB; 0 = measured now (host RAM on CPU, a device's free)
        mappings_fraction=0.5,    # a long-lived driver drops compiled executables between runs above this share of
        #                           vm.max_map_count (memory.release_compiled_if_near_limit; ~10^3 mappings each)
    ))
    # --- train step (horizon.rl.algo.trainer.train_step)
    r.router_replay = True        # replay inference-time experts in the trainer forward (docs/SPEC.md §4.1)
    r.update_router_bias = True   # aux-loss-free bias update from the (real-token) router load
    r.use_reference = True        # keep a frozen copy of the initial params as the KL reference
    # Adam on all parameters (docs/SPEC.md §4): same fields as c.train, read by horizon.train.optim
    # (`steps`, the schedule length, is set by get_config to the experiment's step count)
    r.optim = ml_collections.ConfigDict(dict(
        steps=1000, lr=1e-5, warmup_steps=10, min_lr_ratio=1.0, weight_decay=0.0,
        b1=0.9, b2=0.999, eps=1e-8, grad_clip=1.0,
    ))
    # --- infrastructure failures (docs/SPEC.md §4.1 "infrastructure is not the policy"; horizon.env.rollouts,
    #     horizon.rl.runtime.core): never a reward
    r.infra = ml_collections.ConfigDict(dict(
        group_retries=2,          # reruns of a group with a failed sandbox, on fresh sandboxes
        replacements=2,           # then: fresh reserve prompts tried for the slot before the run stops
    ))
    r.checkpoint_every = 100          # RL checkpoints (RLState + prompt-sampler state) every N steps and at the end
    r.max_checkpoints = 2
    # --- prompt sampler (horizon.rl.runtime.prompts): single epoch + late hard-prompt oversampling
    r.prompts_per_step = 2
    r.slots_per_batch = 0             # groups rolled out in one batched generation (0 = prompts_per_step;
    #                                   must divide it; horizon.rl.runtime.core)
    r.hard_prompt_start_step = -1     # step from which hard prompts are oversampled (-1 = never)
    r.hard_prompt_weight = 1.0        # p(prompt) ~ exp(weight * (hardness - 1))
    r.hard_prompt_turns_weight = 1.0  # hardness mixes turns ...
    r.hard_prompt_thinking_weight = 1.0  # ... and thinking tokens (each relative to the global mean)


# ============================================================================= RL experiment block
# Read by experiments/rl.py and horizon.rl.runtime.loop (the CPU demo: SFT warm start, then RL on the procedural
# config-edit family, horizon.tasks.synthetic via horizon.env.families).
def experiment_config() -> ml_collections.ConfigDict:
    e = ml_collections.ConfigDict()
    e.env = "config_edit"             # task family (horizon.env.families.FAMILIES)
    e.task = ml_collections.ConfigDict(dict(
        value_range=(1, 9),           # one digit to copy from the prompt
        name_style="simple",          # one-word constant names (a 10-14 byte PREFIX_SUFFIX copy took the tiny
        #                               model ~450 SFT steps longer to learn; horizon.tasks.synthetic)
    ))
    e.backend = "docker"              # sandbox backend for rollouts and eval ("local" = unisolated)
    e.sandbox_image = "horizon-sandbox:base"   # docker image of the pooled sandboxes (envs/build_base_image.sh)
    e.out_dir = "runs/rl_tiny"        # run directory: config.json, metrics.jsonl, checkpoints, plots
    e.compilation_cache_dir = "runs/jax_cache"  # persistent XLA cache, every compile ("" = off): shared by every
    #                                   run, seed and strategy (horizon.utils.compiles.use_persistent_cache)
    e.warmup = False                  # compile the engine's and train step's shape plan before step 1, with a
    #                                   progress line (horizon.rl.runtime.warmup; studies turn it on)
    e.steps = 40                      # RL steps
    e.n_sft_tasks = 4096              # train seeds [0, n) for demonstrations; RL prompts come after them
    e.stop_after_sft = False          # experiments/rl.py ends after the SFT warm start (a pipeline's first command)
    e.pool_size = 32                  # pooled sandboxes (= rollouts per RL step = eval chunk)
    e.sandbox_cpus = 0.5              # docker limits per sandbox
    e.sandbox_mem = "256m"
    e.sandbox_disk_mb = 256           # per-sandbox disk budget (watchdog; over it the episode ends "resource"); 0 = off
    e.sandbox_replace_attempts = 3    # fresh sandboxes tried when a pooled one fails its reset
    e.sandbox_executor = "auto"       # docker: "auto" (in-box executor where the image has python3 >= 3.9),
    #                                   "inbox" (required) or "docker-exec" (one exec per action; docs/SANDBOX.md)
    e.verify_timeout_s = 20.0
    e.plot = True
    e.ledger = ""                     # a study ledger (docs/results/<study>.jsonl, from the repository root): the
    #                                   step-0 and final evals' episodes appended as arm `arm` (horizon.studies.arms)
    e.arm = ""                        # this run's arm label in that ledger (a sweep member's settings)
    # --- SFT warm start on scripted solutions (next-token CE on assistant tokens only)
    e.sft = ml_collections.ConfigDict(dict(
        clean_steps=1000,             # stage 1 (warmstart.config_edit_warm_start): correct demos, so the
        #                               tiny model learns to copy the value (a sudden drop, loss ~0.02 -> 1e-4, whose
        #                               timing moves with the environment: steps 300-600 in one venv, none by 500 in
        #                               a rebuilt one, 500-650 of 1000 there; docs/PERF.md; at lr 3e-3 no copy by 800)
        steps=300, batch_size=16, seq_len=208,  # stage 2; rows packed to seq_len (context ~80 + call ~90 tokens)
        #                               (each stage's schedule spans its own step count)
        corrupt_prob=0.5,             # imperfect demonstrations: this fraction carries a wrong value ...
        corrupt="next",               # ... the next one (a systematic off-by-one; "random": a uniform guess)
        log_every=50,
        init_from="",                 # a finished SFT checkpoint directory (e.g. runs/rl_tiny/sft) every arm of a
        #                               study starts from, made there by this SFT if missing ("" = SFT in out_dir)
        optim=ml_collections.ConfigDict(dict(
            lr=1e-2, warmup_steps=20, min_lr_ratio=0.1, weight_decay=0.0,
            b1=0.9, b2=0.95, eps=1e-8, grad_clip=1.0, mtp_loss_weight=0.0, mtp_freeze_trunk=False)),
    ))
    # --- held-out eval: unseen seeds, `passes` independent sampled passes (std over passes = eval noise)
    e.eval = ml_collections.ConfigDict(dict(n_tasks=96, passes=4, every=0, temperature=1.0))
    # --- tracking (horizon.utils.tracking): TensorBoard event files in out_dir (`tensorboard --logdir runs`),
    #     a rollout transcript every text_every RL steps, W&B when wandb.project is set (offline by default)
    e.update(tracking_fields())
    return e
