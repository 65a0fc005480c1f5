"""Sampler vs the training forward (docs/SPEC.md §1: the latent-cache decode must match training)."""

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from horizon.inference import sampler
from horizon.inference.sampler import SamplerConfig
from horizon.model import layers, transformer
from horizon.model.params import numpy_init
from horizon.utils.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup():
    c = load_config_file(ROOT / "configs" / "tiny.py")
    mcfg = ml_collections.FrozenConfigDict(c.model)
    params = numpy_init(mcfg, 0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=n).astype(np.int32) for n in (5, 11, 3)]
    fwd = jax.jit(functools.partial(transformer.forward, cfg=mcfg))
    return mcfg, params, prompts, fwd


FWD_LEN = 32  # pad every check sequence to one length: one compile; causal => padding is inert


def _forward(setup, prompt, gen):
    mcfg, params, _, fwd = setup
    seq = np.concatenate([prompt, gen])
    n = len(seq)
    padded = np.zeros((1, FWD_LEN), np.int32)
    padded[0, :n] = seq
    logits, aux = fwd(params, jnp.asarray(padded))
    ri = np.asarray(aux["router_indices"])[:, :n]  # [L_moe, b*s, k] with b = 1
    return np.asarray(logits[0, :n]), ri


@pytest.fixture(scope="module")
def greedy(setup):
    mcfg, params, prompts, _ = setup
    return sampler.generate(params, prompts, jax.random.key(1), cfg=mcfg, max_new_tokens=8,
                            sampling=SamplerConfig(temperature=0.0, stop_tokens=()))


def test_greedy_equals_forward_argmax(setup, greedy):
    _, _, prompts, _ = setup
    for p, g in zip(prompts, greedy.tokens):
        assert len(g) == 8  # no stop tokens given -> runs to max_new_tokens
        logits, _ = _forward(setup, p, g)
        pred = logits[len(p) - 1: len(p) - 1 + len(g)]
        # The decode path (absorbed MLA, cache) and forward differ by ~1e-6 in f32; a flip would
        # need a top-2 gap that small, so check the gap too to keep the test meaningful.
        top2 = np.sort(pred, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0]).min() > 1e-5
        np.testing.assert_array_equal(pred.argmax(-1), g)


def test_logprobs_match_forward_log_softmax(setup):
    mcfg, params, prompts, _ = setup
    out = sampler.generate(params, prompts, jax.random.key(2), cfg=mcfg, max_new_tokens=8,
                           sampling=SamplerConfig(temperature=1.0, top_p=1.0, stop_tokens=()))
    for p, g, lp in zip(prompts, out.tokens, out.logprobs):
        logits, _ = _forward(setup, p, g)
        ref = jax.nn.log_softmax(jnp.asarray(logits[len(p) - 1: len(p) - 1 + len(g)]), axis=-1)
        ref = np.take_along_axis(np.asarray(ref), g[:, None], axis=-1)[:, 0]
        # f32 with "highest" matmuls; decode vs forward differ only in summation order (absorbed
        # projections): observed ~1e-6, 1e-4 leaves margin while catching any off-by-one position.
        np.testing.assert_allclose(lp, ref, rtol=0, atol=1e-4)


def test_temperature_sampling_is_random_but_deterministic(setup):
    mcfg, params, prompts, _ = setup
    no_stop = SamplerConfig(stop_tokens=())
    a = sampler.generate(params, prompts, jax.random.key(3), cfg=mcfg, max_new_tokens=8, sampling=no_stop)
    b = sampler.generate(params, prompts, jax.random.key(3), cfg=mcfg, max_new_tokens=8, sampling=no_stop)
    c = sampler.generate(params, prompts, jax.random.key(4), cfg=mcfg, max_new_tokens=8, sampling=no_stop)
    for x, y in zip(a.tokens, b.tokens):
        np.testing.assert_array_equal(x, y)
    assert any((x != y).any() for x, y in zip(a.tokens, c.tokens))


def test_a_sequence_samples_the_same_whatever_its_batch_mates_and_chunking(setup):
    """Per-sequence keys: row 0's sampled tokens (temperature 1) are the same with other
    batch-mates, alone (a smaller batch bucket), and for another decode chunking."""
    mcfg, params, prompts, _ = setup
    sc = SamplerConfig(temperature=1.0, stop_tokens=())
    gen = functools.partial(sampler.generate, params, key=jax.random.key(7), cfg=mcfg, max_new_tokens=12, sampling=sc)
    ref = gen(prompts)
    for other in (gen([prompts[0], prompts[2], prompts[1]]), gen(prompts[:1]),
                  gen(prompts, sampling=dataclasses.replace(sc, sync_tokens=5))):
        np.testing.assert_array_equal(other.tokens[0], ref.tokens[0])
        np.testing.assert_allclose(other.logprobs[0], ref.logprobs[0], rtol=1e-5, atol=1e-6)
    assert not np.array_equal(ref.tokens[0][:len(ref.tokens[1])], ref.tokens[1][:len(ref.tokens[0])])


def _zero_mass_at_block_edges(n: int) -> np.ndarray:
    """A random distribution over `n` tokens with zero mass at the first and last token and on both
    sides of every `layers.PREFIX_BLOCK` boundary (where an off-by-one of the two-level search lands)."""
    p = np.random.default_rng(n).uniform(0.2, 1.0, n)
    B = layers.PREFIX_BLOCK
    p[[0, n - 1] + [i for b in range(B, n, B) for i in (b - 1, b)]] = 0.0
    return p / p.sum()


@pytest.mark.parametrize("p", [np.array([0.0, 0.05, 0.15, 0.0, 0.3, 0.5, 0.0]), _zero_mass_at_block_edges(200)],
                         ids=["one_block", "four_blocks"])
def test_inverse_cdf_draws_follow_the_softmax_and_never_a_zero_mass_token(p):
    """`sampler.categorical` (one uniform per draw, inverse CDF over blocks of tokens) samples
    softmax(logits): over 200k draws every frequency is within 5 binomial standard deviations of its
    probability (a 1e-6 chance per token of failing by luck), and tokens of zero mass (-inf: outside a
    nucleus; first and last positions and block edges, where an off-by-one would land) are never drawn."""
    logits = jnp.asarray(np.log(np.where(p > 0, p, 1.0)) + np.where(p > 0, 0.0, -np.inf), jnp.float32)
    n = 200_000
    draws = np.asarray(jax.jit(jax.vmap(sampler.categorical, (0, None)))(jax.random.split(jax.random.key(0), n),
                                                                          logits))
    freq = np.bincount(draws, minlength=len(p)) / n
    assert (freq[p == 0] == 0).all()
    np.testing.assert_array_less(np.abs(freq - p), 5 * np.sqrt(p * (1 - p) / n) + 1e-12)


def test_token_keys_and_uniform_equal_jax_random_bit_for_bit():
    """The unrolled Threefry (`sampler.threefry2x32`) reproduces `jax.random`: `token_keys` =
    vmapped ``fold_in`` and `uniform01` = ``uniform(key, (), float32)``, bit for bit, so the samples
    did not change when the rolled loops went."""
    seq = sampler.sequence_keys(jax.random.key(7), 64)
    idx = jnp.arange(64, dtype=jnp.int32) * 977 + 3
    got = sampler.token_keys(seq, idx)
    want = jax.vmap(jax.random.fold_in)(seq, idx)
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(got)), np.asarray(jax.random.key_data(want)))
    u = np.asarray(jax.jit(sampler.uniform01)(got))
    np.testing.assert_array_equal(u, np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(got)))
    assert 0.0 <= u.min() and u.max() < 1.0


def test_prefix_sum_and_greedy_tokens_equal_cumsum_and_argmax():
    """The sampler's two reductions equal numpy's: `layers.prefix_sum` = cumsum (lengths around the block of
    64, float32: relative 1e-6 of the total, the two summation orders), `greedy_tokens` = argmax with
    ties to the first index."""
    rng = np.random.default_rng(0)
    for n in (1, 63, 64, 65, 320, 1000):
        x = rng.uniform(size=(3, n)).astype(np.float32)
        got = np.asarray(layers.prefix_sum(jnp.asarray(x)))
        np.testing.assert_allclose(got, np.cumsum(x.astype(np.float64), -1), rtol=0, atol=1e-6 * x.sum(-1).max())
    logits = rng.integers(0, 4, size=(64, 50)).astype(np.float32)      # many ties
    np.testing.assert_array_equal(np.asarray(sampler.greedy_tokens(jnp.asarray(logits))), logits.argmax(-1))


def test_tiny_top_p_picks_argmax(setup, greedy):
    mcfg, params, prompts, _ = setup
    out = sampler.generate(params, prompts, jax.random.key(5), cfg=mcfg, max_new_tokens=8,
                           sampling=SamplerConfig(temperature=1.0, top_p=1e-6, stop_tokens=()))
    for x, y in zip(out.tokens, greedy.tokens):
        np.testing.assert_array_equal(x, y)


def test_router_indices_match_forward(setup):
    mcfg, params, prompts, _ = setup
    out = sampler.generate(params, prompts, jax.random.key(6), cfg=mcfg, max_new_tokens=8,
                           sampling=SamplerConfig(stop_tokens=()))
    L_moe = transformer.layer_counts(mcfg)[1]
    for p, g, ri, pri in zip(prompts, out.tokens, out.router_indices, out.prompt_router_indices):
        _, ref = _forward(setup, p, g)  # [L_moe, n+m, k]
        assert ri.shape == (L_moe, len(g), mcfg.num_experts_per_tok)
        np.testing.assert_array_equal(np.sort(ri, -1), np.sort(ref[:, len(p):], -1))
        np.testing.assert_array_equal(np.sort(pri, -1), np.sort(ref[:, : len(p)], -1))


def test_stop_token_ends_sequence(setup, greedy):
    mcfg, params, prompts, _ = setup
    g0 = greedy.tokens[0]
    stop = int(g0[3])
    first = int(np.argmax(g0 == stop))
    out = sampler.generate(params, prompts, jax.random.key(1), cfg=mcfg, max_new_tokens=8,
                           sampling=SamplerConfig(temperature=0.0, stop_tokens=(stop,)))
    np.testing.assert_array_equal(out.tokens[0], g0[: first + 1])
    assert out.stopped[0] and len(out.logprobs[0]) == first + 1
    assert out.router_indices[0].shape[1] == first + 1
    for i in (1, 2):  # other rows stop at their own first `stop` or run to the end
        gi = greedy.tokens[i]
        hits = np.flatnonzero(gi == stop)
        want = gi[: hits[0] + 1] if len(hits) else gi
        np.testing.assert_array_equal(out.tokens[i], want)
        assert out.stopped[i] == bool(len(hits))


def test_bad_inputs_raise(setup):
    mcfg, params, prompts, _ = setup
    with pytest.raises(ValueError, match="max_new_tokens"):
        sampler.generate(params, prompts, jax.random.key(0), cfg=mcfg, max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        sampler.generate(params, prompts, jax.random.key(0), cfg=mcfg, max_new_tokens=4,
                         sampling=SamplerConfig(top_p=0.0))
    with pytest.raises(ValueError, match="max_seq_len"):
        sampler.generate(params, prompts, jax.random.key(0), cfg=mcfg, max_new_tokens=mcfg.max_seq_len)
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate(params, [np.zeros((0,), np.int32)], jax.random.key(0), cfg=mcfg, max_new_tokens=4)


def test_bucket():
    assert [sampler.bucket(n, 16) for n in (1, 16, 17, 33)] == [16, 16, 32, 64]
    assert sampler.bucket(3, 1) == 4
    # two buckets per octave (the engine's attention windows): powers of two and their 1.5x midpoints
    assert ([sampler.bucket(n, 64, per_octave=2) for n in (1, 64, 65, 97, 129, 193, 300)]
            == [64, 64, 96, 128, 192, 256, 384])
    # four per octave (the engine's default windows): 1.25x steps
    assert ([sampler.bucket(n, 64, per_octave=4) for n in (64, 65, 81, 113, 129, 161, 300)]
            == [64, 80, 96, 128, 160, 192, 320])
    # (2, 4]: no integer steps
    assert [sampler.bucket(n, 1, per_octave=4) for n in range(1, 10)] == [1, 2, 4, 4, 5, 6, 7, 8, 10]
    with pytest.raises(ValueError, match="per_octave"):
        sampler.bucket(5, 1, per_octave=3)
