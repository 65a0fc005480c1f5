"""Sharded RL train step (router replay, CP natural layout + EP) == single-device step (docs/SPEC.md §2, §4)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from horizon.model import transformer
from horizon.rl.algo import trainer
from horizon.utils.config import load_config_file
from tests.parallel.conftest import assert_adam_params_close


def _rl_batch(cfg, R=8, S=32, seed=0):
    rng = np.random.default_rng(seed)
    L = transformer.layer_counts(cfg.model)[1]
    k, E = cfg.model.num_experts_per_tok, cfg.model.num_experts
    lengths = rng.integers(12, S + 1, R)
    valid = np.arange(S)[None, :] < lengths[:, None]
    loss_mask = valid & (np.arange(S)[None, :] >= 6)
    tokens = np.where(valid, rng.integers(0, 256, (R, S)), 0).astype(np.int32)
    replay = np.full((L, R * S, k), -1, np.int32)
    on = loss_mask.reshape(-1)
    replay[:, on] = np.stack([rng.choice(E, k, replace=False) for _ in range(L * on.sum())]).reshape(L, -1, k)
    G = 2
    return dict(tokens=tokens, valid=valid, loss_mask=loss_mask,
                sampler_logprobs=np.where(loss_mask, -rng.uniform(0.5, 6.0, (R, S)), 0).astype(np.float32),
                policy_versions=np.where(loss_mask, 3, -1).astype(np.int32), replay_indices=replay,
                advantages=rng.normal(size=R).astype(np.float32), row_chain=np.arange(R, dtype=np.int32),
                row_segment=np.zeros(R, np.int32), row_group=(np.arange(R) // G).astype(np.int32),
                truncated=np.zeros(R, bool), chain_advantages=rng.normal(size=R).astype(np.float32),
                group_rewards=rng.uniform(size=(R // G, G)).astype(np.float32), group_valid=np.ones(R // G, bool))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["ep4xcp2"])
def test_sharded_rl_step_equals_single_device(preset, need8):
    cfg = load_config_file("configs/rl_tiny.py")
    cfg.model.num_layers = 2
    cfg.rl.optim.warmup_steps = 0
    cfg.rl.kl_coef = 1e-3
    cfg.mesh.preset = preset
    params = transformer.init(jax.random.key(0), cfg.model)
    batch = _rl_batch(cfg)
    state = trainer.init_state(jax.tree.map(jnp.copy, params), cfg)      # placed on the config's mesh
    assert not state.params["embed"].sharding.is_fully_replicated
    new_s, m_s = jax.device_get(trainer.train_step(state, batch, cfg=cfg))
    single = cfg.copy_and_resolve_references()
    single.mesh.preset = ""
    new_r, m_r = trainer.train_step(trainer.init_state(params, single), batch, cfg=single)
    for key in ("loss", "grad_norm", "entropy", "logprob_mean"):
        np.testing.assert_allclose(float(m_s[key]), float(m_r[key]), rtol=1e-5, err_msg=key)
    for (path, u), v in zip(jax.tree_util.tree_leaves_with_path(new_s.params), jax.tree.leaves(new_r.params)):
        assert_adam_params_close(u, v, rtol=1e-5, lr=float(cfg.rl.optim.lr), label=jax.tree_util.keystr(path))
