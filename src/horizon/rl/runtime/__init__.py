"""RL runtime (SPEC §4, §4.1): the pieces every loop is made of (`core`: prompt schedule, group
rollout, train step on groups), the synchronous loop and SFT warm start (`loop`), the
asynchronous runtime (`async_loop`), its rollout workers (`workers`), weight sync
(`weight_sync`), group / scheduler stores (`storage`) and the prompt sampler (`prompts`)."""
