"""horizon.rl: reinforcement learning on agent rollouts (docs/SPEC.md §4), by layer.

- `horizon.rl.algo`: losses, rewards, batch layout, the RL train step (pure);
- `horizon.inference`: the one `generate` and the policy adapter;
- `horizon.rl.runtime`: the loops (`core` pieces, `loop.run_rl`, the async `orchestrator`), workers, weight
  sync, stores, prompt sampler;
- `horizon.rl.runtime.checks`: the RL drivers' config validation.

Each layer imports only the ones before it.
"""
