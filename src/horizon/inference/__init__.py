"""RL rollout (SPEC §4, §4.1): how the policy samples.

- `engine.py`: the rollout engine (continuous batching over decode slots of the MLA latent cache,
  an episode's cache kept across turns, a group's prompt prefilled once, on-device multi-token
  decode with stops, per-request keys and sampling parameters, in-flight weight swaps) and
  `EnginePolicy`, its adapter to the agent (``policy(contexts, max_new)`` and ``policy.stream()``,
  with which `horizon.agent.run_episodes` advances episodes independently).
  `policy.rollout_policy` is every caller's policy factory (RL loop, async workers, held-out eval,
  eval harness): the engine, on one device or sharded over the run's multi-device mesh.
- `sampler.py`: the one fixed-batch `generate` (latent-cache decoding in device chunks, per-sequence
  keys, a `poll` hook for in-flight weight swaps, the mesh's sharded placement; benchmarks and tests
  call it directly), `ParamsHolder`, and the pieces the engine shares with it: `sampler.decode_one`
  (the one decode step), `sample_from_logits`, `sequence_keys` / `token_keys`.
"""
