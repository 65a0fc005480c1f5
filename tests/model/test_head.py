"""The chunked LM head (docs/SPEC.md §1.4): the chunked path equals the full-logits one for token
log-probs, entropy, CE and the MTP KL, values and gradients; the LM and RL training losses do not
depend on `model.head_chunk`."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from horizon.agent import Segment, Trajectory
from horizon.model import head, mtp, transformer
from horizon.model import loss as lm_loss
from horizon.model.params import numpy_init
from horizon.rl.algo import batch as rlbatch
from horizon.rl.algo import trainer
from horizon.train import lm
from horizon.utils.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Tolerance: both paths run the same float32 per-token maths; they differ only in how XLA blocks
# the head matmul and in the order the head weight's gradient is summed (within a chunk, then
# across chunks): a few float32 ulps (~1e-7 relative) per sum. rtol 1e-5 leaves ~100x margin,
# atol 1e-6 covers entries that cancel to ~0; a wrong token, shift or dropped chunk is off by
# >= 1e-3 (logits here are O(0.1), log-probs O(6)).
RTOL, ATOL = 1e-5, 1e-6


def _close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=RTOL, atol=ATOL)


def _model_cfg(chunk: int, tie: bool = False):
    """configs/tiny.py's head (vocab 320) on a one-layer dense trunk of width 32: cheap to compile."""
    c = load_config_file(ROOT / "configs" / "tiny.py").model
    c.d_model, c.num_layers, c.num_experts, c.tie_embeddings, c.head_chunk = 32, 1, 0, tie, chunk
    return c


@functools.cache
def _head(tie: bool):
    """Params of the tiny model (their head is what counts here), with a non-trivial final norm."""
    p = head.head_params(numpy_init(_model_cfg(0, tie), 0))
    p["final_norm"] = 1 + 0.1 * jax.random.normal(jax.random.key(3), p["final_norm"].shape)
    return p


def _inputs(b, s, d=32, seed=1):
    kh, kt = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kh, (b, s, d)), jax.random.randint(kt, (b, s), 0, 320)


def _full_stats(params, hidden, targets, c):
    """The reference: full logits, log_softmax, -sum(p log p)."""
    logp = jax.nn.log_softmax(transformer.lm_logits(params, hidden, cfg=c), axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0], -jnp.sum(jnp.exp(logp) * logp, -1)


def _weighted(stats_fn):
    """value_and_grad of a scalar reading both outputs with distinct per-token weights (every token's
    gradient counts; same signs, so the sum does not cancel below the tolerance)."""
    def f(params, hidden, targets):
        lp, ent = stats_fn(params, hidden, targets)
        w = jnp.linspace(0.5, 1.5, lp.size).reshape(lp.shape)
        return jnp.sum(w * lp) - jnp.sum(w[::-1] * ent), (lp, ent)
    return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)


@pytest.mark.parametrize("b,s,chunk,tie", [(2, 13, 8, False), (8, 3, 4, True), (2, 5, 64, True)],
                         ids=["ragged", "rows-over-chunk-tied", "direct-tied"])   # multiples: the loss tests
def test_token_logprobs_match_full_logits(b, s, chunk, tie):
    params, (hidden, targets) = _head(tie), _inputs(b, s)
    c = _model_cfg(chunk, tie)
    chunked = _weighted(functools.partial(head.token_logprobs, cfg=c))
    full = _weighted(functools.partial(_full_stats, c=c))
    got, want = jax.jit(lambda *a: (chunked(*a), full(*a)))(params, hidden, targets)
    _close(got, want)                    # value, log-probs, entropies; grads of hidden, final_norm, the head
    assert float(jnp.abs(got[1][0]["embed" if tie else "lm_head"]).max()) > 0 and float(jnp.abs(got[1][1]).max()) > 0
    jaxpr = str(jax.make_jaxpr(functools.partial(head.token_logprobs, cfg=c))(params, hidden, targets))
    assert ("scan" in jaxpr) == (b * s > chunk)   # at most head_chunk tokens: the direct pass


def test_cross_entropy_matches_next_token_loss():
    params, (hidden, tokens) = _head(False), _inputs(2, 21)
    mask = (jnp.arange(21) % 5 != 0).astype(jnp.float32)[None].repeat(2, 0)
    seg = jnp.array([[0] * 10 + [1] * 11, [0] * 21])

    def chunked(p, h):
        tgt, w = lm_loss.next_token_targets(tokens, mask, seg)
        return lm_loss.mean_nll(head.token_logprobs(p, h, tgt, cfg=_model_cfg(8))[0], w)[0]

    def full(p, h):
        logits = transformer.lm_logits(p, h, cfg=_model_cfg(0))
        return lm_loss.next_token_loss(logits, tokens, mask=mask, segment_ids=seg)[0]

    got, want = jax.jit(lambda *a: (jax.value_and_grad(chunked, (0, 1))(*a),
                                    jax.value_and_grad(full, (0, 1))(*a)))(params, hidden)
    _close(got, want)


def test_token_kl_matches_full_logits(tie=True):
    """KL(stop_grad(p_teacher) || p_student) with a shared (tied) head weight and two norms."""
    params, (ht, _), (hs, _) = _head(tie), _inputs(2, 13, seed=4), _inputs(2, 13, seed=5)
    norm2 = 1 + 0.2 * jax.random.normal(jax.random.key(6), params["final_norm"].shape)
    w = jnp.linspace(0.5, 1.5, 26).reshape(2, 13)

    def loss(kl_fn, p, n2, t, s):
        hp = head.head_params(p)
        return jnp.sum(w * kl_fn(hp, t, {**hp, "final_norm": n2}, s))

    def full_kl(tp, t, sp, s, c):
        logp = jax.nn.log_softmax(jax.lax.stop_gradient(transformer.lm_logits(tp, t, cfg=c)), -1)
        logq = jax.nn.log_softmax(transformer.lm_logits(sp, s, cfg=c), -1)
        return jnp.sum(jnp.exp(logp) * (logp - logq), -1)

    chunked = jax.value_and_grad(functools.partial(loss, functools.partial(head.token_kl, cfg=_model_cfg(8, tie))),
                                 (0, 1, 2, 3))
    full = jax.value_and_grad(functools.partial(loss, functools.partial(full_kl, c=_model_cfg(0, tie))), (0, 1, 2, 3))
    got, want = jax.jit(lambda *a: (chunked(*a), full(*a)))(params, norm2, ht, hs)
    _close(got, want)
    assert float(got[0]) > 0
    assert float(jnp.abs(got[1][2]).max()) == 0.0 and float(jnp.abs(got[1][0]["final_norm"]).max()) == 0.0


# ------------------------------------------------------------------- the training losses, chunked vs not


def _packed_batch(b=2, s=24):
    rng = np.random.default_rng(0)
    seg = np.zeros((b, s), np.int32)
    seg[:, s // 2:] = 1
    seg[:, s - 3:] = 2                                     # a padding segment (masked)
    pos = (np.arange(s) - np.where(seg == 0, 0, np.where(seg == 1, s // 2, s - 3))).astype(np.int32)
    return {"tokens": jnp.asarray(rng.integers(0, 256, (b, s)), jnp.int32), "segment_ids": jnp.asarray(seg),
            "positions": jnp.asarray(np.broadcast_to(pos, (b, s))), "mask": jnp.asarray(seg < 2, jnp.float32)}


def test_lm_losses_do_not_depend_on_head_chunk(tie=True):
    """`train.lm.losses` with MTP (CE + self-distillation KL), tied embeddings: 48 tokens in chunks
    of 16 vs full logits (one jit holding both: one compile)."""
    def config(chunk):
        c = load_config_file(ROOT / "configs" / "tiny.py")
        c.model = _model_cfg(chunk, tie)
        c.model.mtp_depth = 1
        return c

    def value_and_grad(chunk):
        return jax.value_and_grad(functools.partial(lm.losses, cfg=config(chunk)), has_aux=True)

    params = numpy_init(config(0).model, 0)
    both = jax.jit(lambda p, b: (value_and_grad(16)(p, b), value_and_grad(0)(p, b)))
    ((obj, aux), g), ((obj0, aux0), g0) = both(params, _packed_batch())
    assert float(aux["mtp_loss"]) > 0
    _close((obj, aux["loss"], aux["mtp_loss"], aux["tokens"]), (obj0, aux0["loss"], aux0["mtp_loss"], aux0["tokens"]))
    _close(g, g0)


def _rl_batch(cfg, L, k):
    rng = np.random.default_rng(1)

    def seg(n_ctx, n_gen):
        toks = rng.integers(0, 256, 1 + n_ctx + n_gen).astype(np.int32)
        mask = np.arange(len(toks)) > n_ctx
        return Segment(toks, mask, np.where(mask, -5.0, 0.0).astype(np.float32), np.where(mask, 0, -1).astype(np.int32),
                       np.full((L, len(toks), k), -1, np.int32))

    groups = [[Trajectory("a", [seg(5, 9), seg(4, 7)], "", {}, "final"),
               Trajectory("a", [seg(6, 10)], "", {}, "final")]]
    return rlbatch.build_batch(groups, np.array([[1.0, 0.0]]), rlbatch.BatchConfig(
        num_moe_layers=L, experts_per_tok=k, pad_id=0, min_rows=4, min_seq=32))


def test_rl_loss_does_not_depend_on_head_chunk():
    """`rl_loss` (policy log-probs and entropy, the reference's log-probs for the k1 KL): 128 tokens
    in chunks of 16 vs full logits; every metric and gradient (one jit holding both)."""
    def config(chunk):
        c = load_config_file(ROOT / "configs" / "rl_tiny.py")
        c.model = _model_cfg(chunk)
        c.rl.kl_coef = 0.1
        return ml_collections.FrozenConfigDict(c)

    def value_and_grad(chunk):
        return jax.value_and_grad(functools.partial(trainer.rl_loss, cfg=config(chunk)), has_aux=True)

    cfg = config(0)
    b = {key: jnp.asarray(v) for key, v in _rl_batch(cfg, 0, cfg.model.num_experts_per_tok).items()}
    params, ref = numpy_init(cfg.model, 0), numpy_init(cfg.model, 1)
    both = jax.jit(lambda p, bb, r: (value_and_grad(16)(p, bb, ref_params=r), value_and_grad(0)(p, bb, ref_params=r)))
    ((loss, (m, _)), g), ((loss0, (m0, _)), g0) = both(params, b, ref)
    assert float(m["kl_k1"]) != 0 and float(m["entropy"]) > 0
    _close((loss, m), (loss0, m0))
    _close(g, g0)


def test_mtp_loss_matches_full_logits():
    """`mtp.mtp_loss` (chunked) against the full-logits KL of the main head at t+k and depth k's head
    at t, on random main and MTP hidden states (no trunk: the head is what is tested)."""
    c = _model_cfg(8)
    c.mtp_depth = 2
    norms = 1 + 0.1 * jax.random.normal(jax.random.key(2), (2, c.d_model))
    params = {**head.head_params(numpy_init(c, 0)), "mtp": {"head_norm": norms}}
    hidden, _ = _inputs(2, 11)
    mh = jax.random.normal(jax.random.key(7), (2, 2, 11, c.d_model))
    seg = jnp.array([[0] * 6 + [1] * 5] * 2)

    def full(p, h, m):
        valid = mtp.mtp_valid_mask(seg, 2, seg)
        main = transformer.lm_logits(p, h, cfg=c)
        out = []
        for k in (1, 2):
            logp = jax.nn.log_softmax(jax.lax.stop_gradient(lm_loss.shift_left(main, k)), -1)
            logq = jax.nn.log_softmax(transformer.lm_logits({**p, "final_norm": p["mtp"]["head_norm"][k - 1]},
                                                            m[k - 1], cfg=c), -1)
            v = valid[k - 1].astype(jnp.float32)
            out.append(jnp.sum(jnp.sum(jnp.exp(logp) * (logp - logq), -1) * v) / v.sum())
        return jnp.mean(jnp.stack(out))

    def chunked(p, h, m):
        return mtp.mtp_loss(p, h, m, mtp.mtp_valid_mask(seg, 2, seg), cfg=c)[0]

    got, want = jax.jit(lambda *a: (jax.value_and_grad(chunked, (0, 1, 2))(*a),
                                    jax.value_and_grad(full, (0, 1, 2))(*a)))(params, hidden, mh)
    _close(got, want)
    assert float(got[0]) > 0 and float(jnp.abs(got[1][1]).max()) == 0.0   # the main side is the target
