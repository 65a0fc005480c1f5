"""Helpers for model tests: the tiny config, a variant, params and jitted functions."""

import pathlib

import jax
import jax.numpy as jnp

from horizon.model import transformer
from horizon.utils.config import load_config_file

REPO = pathlib.Path(__file__).resolve().parents[2]


def tiny_cfg():
    return load_config_file(REPO / "configs" / "tiny.py").model


def variant_cfg():
    """Full-rank q, YaRN (attention factor != 1 and mscale^2 on the softmax scale), no dense layers, MTP."""
    c = tiny_cfg()
    c.q_lora_rank = 0
    c.first_k_dense = 0
    c.num_layers = 2
    c.mtp_depth = 1
    c.rope_scaling.type = "yarn"
    c.rope_scaling.factor = 4.0
    c.rope_scaling.original_max_position_embeddings = 16
    c.rope_scaling.beta_fast = 32.0
    c.rope_scaling.beta_slow = 1.0
    c.rope_scaling.mscale = 1.0
    c.rope_scaling.mscale_all_dim = 0.8
    return c


class Model:
    """Params plus jitted forward / decode for one config (each compiled at most once per session)."""

    def __init__(self, cfg, seed=0):
        self.cfg = cfg
        self.params = transformer.init(jax.random.key(seed), cfg)
        self.forward = jax.jit(
            lambda p, t, pos, seg: transformer.forward(p, t, cfg=cfg, positions=pos, segment_ids=seg))
        self.forward_replay = jax.jit(lambda p, t, rep: transformer.forward(p, t, cfg=cfg, replay_indices=rep))
        self.decode = jax.jit(lambda p, c, t, pos: transformer.decode(p, c, t, pos, cfg=cfg))

    def tokens(self, b, s, seed=1):
        return jax.random.randint(jax.random.key(seed), (b, s), 0, self.cfg.vocab_size)

    def full(self, tokens):
        b, s = tokens.shape
        pos = jnp.broadcast_to(jnp.arange(s), (b, s))
        return self.forward(self.params, tokens, pos, jnp.zeros((b, s), jnp.int32))
