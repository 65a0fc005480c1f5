"""Asynchronous RL config: configs/rl_tiny.py + an `async_` section (docs/SPEC.md §4, §4.1).

Read by the async runtime (`horizon.rl.runtime.orchestrator`, `horizon.rl.runtime.processes`),
`horizon.rl.runtime.weight_sync` (publisher options) and experiments/rl_async.py.
"""

import ml_collections

from horizon.utils.config import sibling_config


def async_config() -> ml_collections.ConfigDict:
    a = ml_collections.ConfigDict()
    # --- scheduler
    a.max_staleness = 1               # trainer_version - token_version bound (admission control); 0 = synchronous
    a.num_rollout_workers = 1         # rollout processes
    a.trainer_processes = 1           # trainer actors (one per host), one jax.distributed job over the mesh
    a.trainer_start_timeout_s = 300.0 # a trainer group's actor 0 must answer (coordinator address) within this
    a.queue_depth = 1                 # outstanding slot requests per worker (0 = rl.prompts_per_step; at
    #                                   least one generation batch)
    a.pool = "ray"                    # WorkerPool: "ray" (actors; horizon.rl.runtime.ray_pool.RayPool)
    a.ray_address = ""                # "" = start Ray on this machine; "HOST:PORT" / "auto" = join a running cluster
    a.ray_object_store_mb = 2048      # object store of a Ray started here (sized for a 24 GB machine)
    a.ray_memory_threshold = 0.9      # Ray's memory monitor kills workers above this fraction of RAM
    a.trainer_resources = ""          # Ray custom resources each trainer actor needs, "name=amount,..." (e.g.
    #                                   "trainer=1": pins it to nodes started with --resources='{"trainer": 1}')
    a.rollout_resources = ""          # the same for each rollout actor (e.g. "rollout=1"); actors are SPREAD
    a.docker_hosts = ""               # Docker engine per rollout node, "IP=URL,...,*=URL" ("" = each node's
    #                                   DOCKER_HOST or local socket), e.g. "10.0.0.5=tcp://10.0.0.5:2375"
    a.poll_s = 0.02                   # orchestrator / trainer polling interval
    a.storage_url = ""                # groups/ and weights/ under this fsspec URL (e.g. "s3://bucket/runs",
    #                                   "file:///shared/runs"; "" = the run directory), + "/<loop name>"
    a.weights_timeout_s = 600.0       # a worker waits this long for the weights version it needs
    # --- environment
    a.env = "toy"                     # "toy" (single-turn token task, no sandbox) | "experiment" (the task family
    #                                   of the `exp` block, e.g. configs/rl_async_tiny.py: experiments/rl.py's tasks)
    a.toy_max_new_tokens = 24         # generated tokens per toy rollout
    a.prompt_start = 0                # first toy prompt index
    a.init_from = ""                  # finished SFT checkpoint dir to start from ("" = random init)
    # (generation batches: rl.slots_per_batch; in-flight updates: rl.sampler.chunk_tokens / kv_mode)
    a.weight_poll_interval_s = 0.0    # min seconds between LATEST reads in a worker (0 = every chunk)
    # --- weight publishing (horizon.rl.runtime.weight_sync)
    a.publish_every = 1               # trainer steps between published versions
    a.publish_dtype = "bfloat16"      # what samplers run ("bfloat16" | "float32"; trainer keeps f32 master)
    a.full_every = 10                 # full snapshot every N versions, deltas in between
    a.keep_fulls = 2                  # full-snapshot chains kept on disk
    a.codec = "xor_zstd"              # "xor_zstd" | "xor_zlib"; zstd-1 deltas: zlib-6's size, 8x faster
    a.codec_level = 1                 # (benchmarks/transfer.py on real deltas, docs/PERF.md)
    a.shard_elems = 1 << 20           # leaves split into shards of this many elements
    a.publish_threads = 1             # compression threads
    # --- step-level checkpoints (orbax, horizon.train.checkpoint)
    # --- processes
    a.threads_per_process = 1         # XLA CPU threads per JAX process (shared 2-core machine)
    a.run_dir = "runs/rl_async"       # output dir (results.json, one subdir per loop)
    # --- experiments/rl_async.py
    a.compare = ("sync", "async")     # loops to run: "sync" (loop.run_rl), "async", "sync_mp" (async at staleness 0)
    a.smooth = 5                      # moving-average window over steps for the reward targets
    return a


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "rl_tiny.py")
    c.async_ = async_config()
    c.exp.steps = 30                  # trainer steps of every loop (= rl.optim.steps)
    c.rl.checkpoint_every = 1         # the trainer checkpoints every step (a restart loses no step); the XLA
    #                                   cache shared by all processes is exp.compilation_cache_dir
    # the toy env: short rows, small buckets; lr high enough to learn in tens of steps
    c.model.max_seq_len = 128
    c.rl.group_size = 4
    c.rl.prompts_per_step = 2
    c.rl.sampler.min_batch_bucket = 1
    c.rl.sampler.min_prompt_bucket = 64
    c.rl.sampler.min_new_bucket = 32
    c.rl.sampler.chunk_tokens = 8     # weight checks every 8 of the 24 toy tokens
    c.rl.slots_per_batch = 1          # one group per generation: workers take slots one by one
    c.rl.batch.min_rows = 8
    c.rl.batch.min_seq = 64
    c.rl.optim.lr = 3e-3
    c.rl.optim.warmup_steps = 0
    c.rl.length_penalty.enabled = True   # (make run's task turns it off; the toy task keeps rl_config's curve)
    c.rl.kl_coef = 0.0                # no reference forward (faster trainer step on CPU)
    return c
