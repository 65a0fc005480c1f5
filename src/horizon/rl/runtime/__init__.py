"""RL runtime (docs/SPEC.md §4, §4.1): the pieces every loop is made of (`core`: prompt schedule,
group rollout, train step on groups), the synchronous loop and SFT warm start (`loop`), and the
asynchronous runtime over the same pieces: the orchestrator and run summaries (`orchestrator`),
the trainer and rollout-worker process mains (`processes`), where they run (`pools`: the
`WorkerPool` adapter; `ray_pool`: Ray actors; `distributed`: a trainer group under
jax.distributed) and their config helpers (`async_setup`). Beside them: rollout-worker pieces
(`workers`), weight sync (`weight_sync`), group / scheduler stores (`storage`), the prompt sampler
(`prompts`), config validation (`checks`) and the pre-run memory check (`memory`)."""
