"""How the policy samples (docs/SPEC.md §1, §4, §4.1). Design: docs/INFERENCE.md.

- `policy.py`: `Generation`, the `Policy` interface, `EnginePolicy` (``policy(contexts, max_new)``
  and ``policy.stream()``, through which `horizon.agent.run_episodes` advances episodes
  independently) and `rollout_policy`, every caller's policy factory.
- `engine.py`: the rollout engine `Engine` (continuous batching over latent-cache slots), its
  `Request` / `Completion` types and `generate_requests`.
- `slots.py`: the engine's host-side slot bookkeeping: queue policy, LRU eviction to the park
  store, longest-common-prefix reuse.
- `device.py`: the engine's jitted device functions (chunked prefill, draws, row copies and
  swaps, the multi-step decode loop).
- `replicas.py`: `EngineReplicas` (one engine per local device) and `make_engine`.
- `config.py`: `EngineConfig`, read from and validated against `rl.sampler`.
- `sampler.py`: the one fixed-batch `generate` (`SamplerConfig`), `ParamsHolder`, and what the
  engine shares with it: `decode_one` (the one decode step), `sample_from_logits`,
  `sequence_keys` / `token_keys`.
"""
