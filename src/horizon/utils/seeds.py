"""The run's PRNG keys, derived from the config's one `seed` by one function (docs/SPEC.md §7: runs are
reproducible from their config).

`run_keys(seed)` splits `jax.random.key(seed)` into one key per name of `KEY_NAMES`. With JAX's
partitionable threefry (the default since 0.5) `split(k, n)[i]` does not depend on `n`, so adding a
name at the end never changes the keys of the names before it.
"""

from __future__ import annotations

import jax

# params init | (unused since the one RL loop: kept so the later keys keep their values) | SFT gate |
# held-out evals | RL rollouts (`horizon.rl.runtime.core.policy_key`)
KEY_NAMES = ("init", "rl", "check", "eval", "rollout")


def run_keys(seed: int) -> dict[str, jax.Array]:
    """{name: key} for every name of `KEY_NAMES`, from `seed`."""
    ks = jax.random.split(jax.random.key(int(seed)), len(KEY_NAMES))
    return dict(zip(KEY_NAMES, ks))
