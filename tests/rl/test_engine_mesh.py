"""The rollout engine on a multi-device mesh (horizon.inference.engine, docs/SPEC.md §2, §4): params
placed by the mesh rules, the slot cache split over the batch axes, and the same samples as the
engine on one device with the same request keys — continuous batching, a group's prompt copied to its
followers, an episode's cache swapped out and back in, later turns reusing their cache.

8 fake CPU devices (tests/conftest.py); the mesh is data 2 x fsdp 2 (4 batch ranks, FSDP-split weights),
4 slots: one slot per batch rank."""

import dataclasses
import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from horizon.inference import engine as E
from horizon.inference.config import EngineConfig, validate_engine
from horizon.inference.replicas import EngineReplicas
from horizon.model.params import numpy_init
from horizon.parallel import mesh as pmesh
from horizon.utils.config import ConfigError, load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]

MAX_LEN = 128
EC = EngineConfig(slots=4, max_len=MAX_LEN, prefill_chunk=32, min_prefill_chunk=32, sync_tokens=8,
                  min_window=MAX_LEN, park_tokens=2 * MAX_LEN, stop_slots=4)
# Logprob tolerance: f32 with "highest" matmuls (tests/conftest.py). The mesh run does each row's
# arithmetic on the same numbers; only reduction order differs (FSDP-gathered weights, the routed
# expert sums, the masked gather + all-reduce of a prefill's cache rows): ~1e-6 observed, as the
# sharded `generate` (tests/parallel/test_sharded_sampler.py). 1e-4 still catches a wrong row or
# position, which moves a logprob by O(1).
ATOL = 1e-4


def _cfg(**sizes):
    c = load_config_file(ROOT / "configs" / "tiny.py")
    c.model.num_layers = 2                      # one dense + one MoE layer (routing to compare)
    c.model.max_seq_len = MAX_LEN
    for a, n in sizes.items():
        c.mesh[a] = n
    return c


@pytest.fixture(scope="module")
def need8():
    if len(jax.devices()) < 8:
        pytest.skip(f"needs 8 devices, have {len(jax.devices())} (XLA_FLAGS set too late?)")


def _scenario(eng):
    """Five owned episodes on 4 slots: two share their first context (a group: one prefill, copied to
    the follower), the fifth waits in the queue and evicts a parked cache; then two second turns, one
    swapped back in from the park store, one extending its own cache. Returns every completion in
    submission order."""
    rng = np.random.default_rng(3)
    ctx = [rng.integers(0, 256, int(n)).astype(np.int32) for n in (20, 20, 9, 37, 14)]
    ctx[1] = ctx[0]
    news = [12, 12, 5, 17, 9]
    key = jax.random.key(11)
    first = E.generate_requests(eng, [E.Request(c, jax.random.fold_in(key, i), n, owner=i)
                                      for i, (c, n) in enumerate(zip(ctx, news))])
    obs = rng.integers(0, 256, 6).astype(np.int32)
    second = [E.generate_requests(eng, [E.Request(np.concatenate([ctx[i], first[i].tokens, obs]),
                                                  jax.random.fold_in(key, 10 + i), 8, owner=i)])[0]
              for i in (2, 4)]                     # one at a time: prefill batches of 4 and 1 only (compiles)
    return first + second


def test_engine_on_a_mesh_samples_what_one_device_samples(need8):
    single, mesh_c = _cfg(), _cfg(data=2, fsdp=2)
    params = numpy_init(single.model, 0)
    ref_eng = E.Engine(single, params=params, engine=EC, stop_tokens=())
    eng = E.Engine(mesh_c, params=params, engine=EC, stop_tokens=())
    assert ref_eng.mesh is None and eng.mesh is not None
    assert not eng.params["embed"].sharding.is_fully_replicated          # the FSDP rules split the weights
    batch = NamedSharding(eng.mesh, P(None, pmesh.BATCH_AXES, None, None))

    def check_layout():
        for leaf in jax.tree.leaves(eng.cache):
            assert leaf.sharding.is_equivalent_to(batch, leaf.ndim), leaf.sharding
            assert leaf.sharding.shard_shape(leaf.shape)[1] == 1          # 4 slots over 4 batch ranks

    check_layout()
    ref, out = _scenario(ref_eng), _scenario(eng)
    check_layout()                                   # prefill, copies, swap-in and decode kept the layout
    for k in ("evictions", "reused_tokens", "prefill_tokens"):     # the scenario exercised what it meant to
        assert eng.stats[k] == ref_eng.stats[k] > 0, k
    for i, (a, b) in enumerate(zip(ref, out)):
        np.testing.assert_array_equal(b.tokens, a.tokens, err_msg=f"request {i}")
        np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=0, atol=ATOL, err_msg=f"request {i}")
        np.testing.assert_array_equal(b.router_indices, a.router_indices, err_msg=f"request {i}")
        assert (b.prefill_tokens, b.reused_tokens) == (a.prefill_tokens, a.reused_tokens)


def test_mesh_slots_must_divide_over_the_batch_ranks(need8):
    """4 slots over 8 data-parallel ranks: a one-line error at construction, and `validate_engine`
    names the field before any run starts."""
    with pytest.raises(ValueError, match="multiple of the mesh's 8 data-parallel"):
        E.Engine(_cfg(data=8), params={}, engine=EC)
    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    c.mesh.update(dict(data=2, fsdp=2))
    validate_engine(c)
    c.rl.sampler.engine_slots = 6
    with pytest.raises(ConfigError, match=r"rl\.sampler\.engine_slots=6: .*4 data-parallel"):
        validate_engine(c)


def test_engine_replicas_config_is_checked_before_a_run(need8):
    """`rl.sampler.engine_replicas`: slots must divide over the replicas, and replicas do not combine
    with a multi-device mesh (the engine is sharded over it); both name the field (`validate_engine`),
    and `EngineReplicas` refuses a mesh at construction."""
    c = load_config_file(ROOT / "configs" / "rl_tiny.py")
    c.rl.sampler.engine_replicas = 2
    validate_engine(c)
    c.rl.sampler.engine_slots = 7
    with pytest.raises(ConfigError, match=r"rl\.sampler\.engine_slots=7: .*engine_replicas=2"):
        validate_engine(c)
    c.rl.sampler.engine_slots = 8
    c.mesh.update(dict(data=2))
    with pytest.raises(ConfigError, match=r"rl\.sampler\.engine_replicas=2: must be 1 with a multi-device mesh"):
        validate_engine(c)
    with pytest.raises(ValueError, match="do not combine"):
        EngineReplicas(_cfg(data=2), params={}, engine=dataclasses.replace(EC, replicas=2))
