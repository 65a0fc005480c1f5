"""The rollout engine (horizon.inference.engine, docs/SPEC.md §1, §4, §6): the training forward's
logprobs and routing, continuous batching == one-at-a-time `generate`, per-turn prefill of only the
new tokens, one prefill per group, in-flight weight swaps, and the agent loop's independent path.

One engine shape throughout (4 slots x 512 positions, one attention window, 32-token prefill chunks)
so the whole file compiles a handful of functions once."""

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from horizon.inference import engine as E
from horizon.inference import policy as engine_policy
from horizon.inference import replicas, sampler
from horizon.inference.config import EngineConfig
from horizon.inference.sampler import SamplerConfig
from horizon.model import transformer
from horizon.model.params import numpy_init
from horizon.utils.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_LEN = 512
EC = EngineConfig(slots=4, max_len=MAX_LEN, prefill_chunk=32, min_prefill_chunk=32, sync_tokens=8,
                  min_window=MAX_LEN, park_tokens=2 * MAX_LEN, stop_slots=4)
GEN = dict(min_prompt_bucket=64, min_new_bucket=32)    # one generate compile for every reference call
NO_STOP = SamplerConfig(stop_tokens=(), **GEN)
# Logprob tolerance: float32 with "highest" matmuls (tests/conftest.py); the engine's decode and chunked
# prefill differ from the training forward only in summation order (absorbed MLA projections, chunk
# boundaries, window lengths): observed ~1e-6. 1e-4 leaves margin and still catches any off-by-one
# position or stale cache row, which moves a logprob by O(1).
ATOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    c = load_config_file(ROOT / "configs" / "tiny.py")
    c.model.max_seq_len = MAX_LEN
    mcfg = ml_collections.FrozenConfigDict(c.model)
    params = numpy_init(mcfg, 0)
    fwd = jax.jit(functools.partial(transformer.forward, cfg=mcfg))
    return mcfg, params, fwd


def _engine(setup, **kw):
    mcfg, params, _ = setup
    kw.setdefault("params", params)
    return E.Engine(mcfg, engine=EC, **kw)


def _prompts(n, lo=3, hi=60, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=int(k)).astype(np.int32) for k in rng.integers(lo, hi, size=n)]


def _forward(setup, seq, params=None):
    """Training-forward logits and routing of one sequence (padded to MAX_LEN: one compile; causal)."""
    mcfg, p0, fwd = setup
    n = len(seq)
    padded = np.zeros((1, MAX_LEN), np.int32)
    padded[0, :n] = seq
    logits, aux = fwd(p0 if params is None else params, jnp.asarray(padded))
    return np.asarray(logits[0, :n]), np.asarray(aux["router_indices"])[:, :n]


def _check_against_forward(setup, ctx, comp, params=None):
    """Completion `comp` of context `ctx`: logprobs = forward log_softmax, routing = forward routing."""
    n, m = len(ctx), len(comp.tokens)
    logits, ri = _forward(setup, np.concatenate([ctx, comp.tokens]), params)
    ref = jax.nn.log_softmax(jnp.asarray(logits[n - 1: n - 1 + m]), axis=-1)
    ref = np.take_along_axis(np.asarray(ref), comp.tokens[:, None], axis=-1)[:, 0]
    np.testing.assert_allclose(comp.logprobs, ref, rtol=0, atol=ATOL)
    np.testing.assert_array_equal(np.sort(comp.router_indices, -1), np.sort(ri[:, n:], -1))


def _seq_key(i):
    """Request i's sequence key: what row 0 of ``generate([prompt], key(100 + i))`` draws with."""
    return jax.random.fold_in(jax.random.key(100 + i), 0)


def _generate_one(setup, prompt, i, max_new, stops=(), params=None):
    mcfg, p0, _ = setup
    return sampler.generate(p0 if params is None else params, [prompt], jax.random.key(100 + i), cfg=mcfg,
                            max_new_tokens=max_new, sampling=SamplerConfig(stop_tokens=stops, **GEN))


def test_continuous_batching_equals_one_at_a_time_generate(setup):
    """8 requests on 4 slots (staggered prompt lengths, budgets and a stop id, so slots free at
    different times and waiting requests take them mid-batch), a long prompt prefilled in 3 chunks:
    every request samples exactly what `generate` samples for it alone with the same key."""
    prompts = _prompts(8)
    prompts[5] = _prompts(1, 70, 71, seed=1)[0]                 # > 2 prefill chunks
    news = [24, 5, 17, 9, 30, 12, 3, 20]
    first = [_generate_one(setup, p, i, n) for i, (p, n) in enumerate(zip(prompts, news))]
    stop = int(first[0].tokens[0][6])                            # request 0 stops early on it (others may)
    eng = _engine(setup, stop_tokens=(stop,))
    reqs = [E.Request(p, _seq_key(i), n) for i, (p, n) in enumerate(zip(prompts, news))]
    out = E.generate_requests(eng, reqs)
    assert eng.stats["round_trips"] > 1 and len(out[0].tokens) <= 7
    for i, (p, n, c) in enumerate(zip(prompts, news, out)):
        ref = _generate_one(setup, p, i, n, stops=(stop,))
        np.testing.assert_array_equal(c.tokens, ref.tokens[0])
        np.testing.assert_allclose(c.logprobs, ref.logprobs[0], rtol=0, atol=ATOL)
        np.testing.assert_array_equal(c.router_indices, ref.router_indices[0])
        assert c.stopped == ref.stopped[0] and c.prefill_tokens == len(p) and c.reused_tokens == 0
        assert (c.versions == 0).all()


def test_logprobs_and_routing_equal_training_forward(setup):
    prompts = _prompts(3, seed=2)
    eng = _engine(setup, stop_tokens=())
    out = E.generate_requests(eng, [E.Request(p, _seq_key(i), 16) for i, p in enumerate(prompts)])
    for p, c in zip(prompts, out):
        assert len(c.tokens) == 16
        _check_against_forward(setup, p, c)


def test_multi_turn_prefills_only_new_tokens_and_rebuilds_after_a_rewrite(setup):
    """An episode (owner) keeps its cache between turns: turn 2's context = turn 1's context +
    generation + an observation prefills exactly the observation; its samples and logprobs are
    those of a fresh prefill (`generate`) and of the training forward. A rewrite (a summary
    replacing the history) rebuilds from the longest common prefix."""
    eng = _engine(setup, stop_tokens=())
    obs = _prompts(2, 10, 30, seed=3)
    ctx1 = _prompts(1, 40, 41, seed=4)[0]
    (c1,) = E.generate_requests(eng, [E.Request(ctx1, _seq_key(0), 12, owner="ep")])
    assert c1.prefill_tokens == len(ctx1)
    ctx2 = np.concatenate([ctx1, c1.tokens, obs[0]])
    (c2,) = E.generate_requests(eng, [E.Request(ctx2, _seq_key(1), 12, owner="ep")])
    assert c2.prefill_tokens == len(obs[0]) and c2.reused_tokens == len(ctx1) + len(c1.tokens)
    np.testing.assert_array_equal(c2.tokens, _generate_one(setup, ctx2, 1, 12).tokens[0])
    _check_against_forward(setup, ctx2, c2)
    ctx3 = np.concatenate([ctx1[:20], obs[1]])                  # rewritten history: shares 20 tokens
    (c3,) = E.generate_requests(eng, [E.Request(ctx3, _seq_key(2), 12, owner="ep")])
    assert c3.prefill_tokens == len(obs[1]) and c3.reused_tokens == 20
    _check_against_forward(setup, ctx3, c3)
    eng.release("ep")
    assert eng.stats["prefill_tokens"] == len(ctx1) + len(obs[0]) + len(obs[1])


def test_group_prefills_its_prompt_once(setup):
    """G = 4 rollouts of one prompt: one prefill of the prompt, the others copy its cache and draw
    their first token from its logits, each with its own key (== generate alone)."""
    prompt = _prompts(1, 50, 51, seed=5)[0]
    eng = _engine(setup, stop_tokens=())
    out = E.generate_requests(eng, [E.Request(prompt, _seq_key(i), 10) for i in range(4)])
    assert eng.stats["prefill_tokens"] == len(prompt)
    assert sorted(c.prefill_tokens for c in out) == [0, 0, 0, len(prompt)]
    for i, c in enumerate(out):
        np.testing.assert_array_equal(c.tokens, _generate_one(setup, prompt, i, 10).tokens[0])
    assert len({c.tokens.tobytes() for c in out}) > 1


def test_short_prefix_hits_are_prefilled_not_copied(setup):
    """`min_reuse`: a prompt sharing fewer tokens than it with another slot's cache prefills them (no
    copy, no copy compile); a longer shared prefix is copied. The samples are the same either way."""
    eng = _engine(setup, stop_tokens=(), min_reuse=8)
    a = _prompts(1, 30, 31, seed=11)[0]
    b = np.concatenate([a[:3], _prompts(1, 20, 21, seed=12)[0]])        # shares 3 tokens with a
    c = np.concatenate([a[:12], _prompts(1, 20, 21, seed=13)[0]])       # shares 12 tokens with a
    E.generate_requests(eng, [E.Request(a, _seq_key(0), 4, owner="a")])
    (cb,) = E.generate_requests(eng, [E.Request(b, _seq_key(1), 4, owner="b")])
    (cc,) = E.generate_requests(eng, [E.Request(c, _seq_key(2), 4, owner="c")])
    assert (cb.reused_tokens, cb.prefill_tokens) == (0, len(b))
    assert (cc.reused_tokens, cc.prefill_tokens) == (12, len(c) - 12)
    for ctx, out, i in ((b, cb, 1), (c, cc, 2)):
        np.testing.assert_array_equal(out.tokens, _generate_one(setup, ctx, i, 4).tokens[0])
    with pytest.raises(ValueError, match="min_reuse"):
        _engine(setup, min_reuse=0)
    with pytest.raises(ValueError, match="window_per_octave"):
        _engine(setup, window_per_octave=3)


def test_queue_policy_swaps_idle_caches_out_and_back(setup):
    """More episodes than slots: a parked cache is swapped out when its slot is needed and swapped
    back for the owner's next turn (still prefilling only the new tokens)."""
    eng = _engine(setup, stop_tokens=())
    ctxs = _prompts(5, 20, 40, seed=6)
    outs = E.generate_requests(eng, [E.Request(c, _seq_key(i), 6, owner=i) for i, c in enumerate(ctxs)])
    assert eng.stats["evictions"] >= 1                          # 5 owners on 4 slots
    obs = _prompts(1, 8, 9, seed=7)[0]
    nxt = [np.concatenate([c, o.tokens, obs]) for c, o in zip(ctxs, outs)]
    outs2 = E.generate_requests(eng, [E.Request(c, _seq_key(10 + i), 6, owner=i) for i, c in enumerate(nxt)])
    assert [o.prefill_tokens for o in outs2] == [len(obs)] * 5
    for c, o in zip(nxt, outs2):
        _check_against_forward(setup, c, o)


@pytest.mark.parametrize("kv_mode", ["keep", "recompute"])
def test_in_flight_weight_swap_tags_versions(setup, kv_mode):
    """poll() switches to other weights after the first round-trips: every token carries the version
    that sampled it; with "recompute" the tokens after the switch are the new weights' (logprobs =
    the new weights' training forward over the whole sequence)."""
    mcfg, p0, _ = setup
    p1 = jax.tree.map(lambda x: x * 1.3, p0)
    calls = []

    def poll():
        calls.append(1)
        return (p0, 0) if len(calls) <= 2 else (p1, 1)

    eng = E.Engine(mcfg, poll=poll, engine=dataclasses_replace(EC, kv_mode=kv_mode), stop_tokens=())
    prompt = _prompts(1, seed=8)[0]
    (c,) = E.generate_requests(eng, [E.Request(prompt, _seq_key(0), 30)])
    v = c.versions
    assert eng.stats["switches"] == 1 and v[0] == 0 and v[-1] == 1 and (np.diff(v) >= 0).all()
    if kv_mode == "recompute":
        n, k = len(prompt), int(np.argmax(v == 1))
        logits, ri = _forward(setup, np.concatenate([prompt, c.tokens]), p1)
        ref = jax.nn.log_softmax(jnp.asarray(logits[n - 1 + k: n - 1 + len(v)]), axis=-1)
        ref = np.take_along_axis(np.asarray(ref), c.tokens[k:, None], axis=-1)[:, 0]
        np.testing.assert_allclose(c.logprobs[k:], ref, rtol=0, atol=ATOL)
        np.testing.assert_array_equal(np.sort(c.router_indices, -1), np.sort(ri[:, n:], -1))


def dataclasses_replace(ec, **kw):
    import dataclasses

    return dataclasses.replace(ec, **kw)


def test_bad_requests_raise(setup):
    eng = _engine(setup)
    with pytest.raises(ValueError, match="max_len"):
        eng.submit(E.Request(np.zeros(MAX_LEN, np.int32), _seq_key(0), 4))
    with pytest.raises(ValueError, match="at least one token"):
        eng.submit(E.Request(np.zeros(0, np.int32), _seq_key(0), 4))
    with pytest.raises(ValueError, match="max_new"):
        eng.submit(E.Request(np.zeros(3, np.int32), _seq_key(0), 0))
    eng.submit(E.Request(np.zeros(3, np.int32), _seq_key(0), 4, owner="a"))
    with pytest.raises(ValueError, match="in flight"):
        eng.submit(E.Request(np.zeros(3, np.int32), _seq_key(1), 4, owner="a"))


def test_agent_episodes_advance_independently_on_the_engine(setup):
    """`run_episodes` with an `EnginePolicy` (the independent path) on key-recall-sized episodes in
    local sandboxes: trajectories as the lockstep path makes them, and each later turn prefills only
    what the episode appended (observation + turn header), not its whole context."""
    from horizon.agent import run_episodes
    from horizon.data.tokenizer import ByteTokenizer
    from horizon.env.families import family_from_config, make_episode
    from horizon.sandbox.factory import open_sandbox

    mcfg, params, _ = setup
    c = load_config_file(ROOT / "configs" / "selfsum_tiny.py")
    c.exp.task.update(dict(n_logs=1, log_lines=1))
    c.agent.update(dict(max_new_tokens=24, max_malformed_calls=3, max_context_tokens=MAX_LEN,
                        trigger_tokens=MAX_LEN - 32, context_strategy="none", num_tool_workers=2))
    fam = family_from_config(c.exp)
    policy = engine_policy.EnginePolicy(sampler.ParamsHolder(params), mcfg, jax.random.key(0), engine=EC)
    tasks = fam.tasks("train", 3)
    boxes = [open_sandbox("local") for _ in tasks]
    try:
        for t, sb in zip(tasks, boxes):
            fam.reset(sb, t)
        eps = [make_episode(fam, t, sb, ByteTokenizer(), c.agent) for t, sb in zip(tasks, boxes)]
        trajs = run_episodes(policy, eps, num_tool_workers=2)
    finally:
        for sb in boxes:
            sb.close()
    log = policy.log
    assert len(log) == sum(t.stats["turns"] for t in trajs) and all(t.end_reason for t in trajs)
    later = [r for r in log if r["turn"] > 0]
    assert later and all(r["prefill_tokens"] == r["context_tokens"] - r["reused_tokens"] for r in log)
    first = [r for r in log if r["turn"] == 0]                # one group: identical task contexts
    assert sum(r["prefill_tokens"] for r in first) == first[0]["context_tokens"]
    prev = {(r["episode"], r["turn"]): r for r in log}
    for r in later:           # this turn's new tokens: its context minus the last turn's context and generation
        q = prev[(r["episode"], r["turn"] - 1)]
        assert r["prefill_tokens"] == r["context_tokens"] - q["context_tokens"] - q["generated_tokens"] > 0
    for t in trajs:
        for s in t.segments:
            assert s.router_indices.shape[1] == len(s.tokens) and (s.policy_versions[s.loss_mask] == 0).all()


def test_episode_samples_do_not_depend_on_scheduling(setup):
    """Episode e's turn t draws with ``fold_in(fold_in(stream key, e), t)``: two turns of episode 3
    sample the same tokens run alone as among 6 episodes on 4 slots (queueing, evictions, other
    episodes' turns admitted between its own)."""
    mcfg, params, _ = setup
    ctxs = _prompts(6, 20, 40, seed=9)
    obs = _prompts(1, 8, 9, seed=10)[0]

    def two_turns(episodes):
        pol = engine_policy.EnginePolicy(sampler.ParamsHolder(params), mcfg, jax.random.key(7), engine=EC,
                                         stop_tokens=())
        st = pol.stream()
        for e in episodes:
            st.submit(e, ctxs[e], 6)
        first, out = {}, {}
        while st.busy:
            for e, g in st.advance():
                if e in first:
                    out[e] = g.tokens
                    continue
                first[e] = g.tokens
                st.submit(e, np.concatenate([ctxs[e], g.tokens, obs]), 6)
        return first, out, pol

    first_all, second_all, pol = two_turns(range(6))
    first_one, second_one, _ = two_turns([3])
    assert pol.engine.stats["evictions"] >= 1 and pol.state["gen_s"] > 0
    np.testing.assert_array_equal(first_all[3], first_one[3])
    np.testing.assert_array_equal(second_all[3], second_one[3])


def test_rollout_policy_is_always_the_engine():
    """`rollout_policy` has no lockstep alternative: the RL and eval configs get an `EnginePolicy`
    (the eval config carries the run's sampler section), a multi-device mesh one that runs sharded
    (tests/rl/test_engine_mesh.py); a config without the engine's sizes is a one-line error."""
    from horizon.inference.sampler import ParamsHolder

    assert not hasattr(E, "uses_engine") and not hasattr(sampler, "make_policy")
    c = load_config_file(ROOT / "configs" / "eval_tiny.py")
    c.rl.sampler.engine_slots = 8
    pol = engine_policy.rollout_policy(ParamsHolder({}), c, jax.random.key(0))
    assert isinstance(pol, engine_policy.EnginePolicy) and pol.engine.mesh is None and pol.engine.ec.slots == 8
    with pytest.raises(ValueError, match="rl.sampler section"):
        engine_policy.rollout_policy(ParamsHolder({}), ml_collections.ConfigDict(dict(model=c.model)),
                                     jax.random.key(0))


def test_engine_policy_batched_call_equals_generate_and_swaps_weights(setup):
    """``policy(contexts, max_new)`` (toy env groups, eval warm-up): row i samples what `generate`
    samples for it with the call's key split, and a `ParamsHolder` update takes effect (new version)."""
    mcfg, params, _ = setup
    prompts = _prompts(3, seed=4)
    holder = sampler.ParamsHolder(params)
    policy = engine_policy.EnginePolicy(holder, mcfg, jax.random.key(0), engine=EC, stop_tokens=())
    gens = policy(prompts, 8)
    _, sub = jax.random.split(jax.random.key(0))            # the first call's key split
    ref = sampler.generate(params, prompts, sub, cfg=mcfg, max_new_tokens=8, sampling=NO_STOP)
    for g, t, lp in zip(gens, ref.tokens, ref.logprobs):
        np.testing.assert_array_equal(g.tokens, t)
        np.testing.assert_allclose(g.logprobs, lp, rtol=0, atol=ATOL)
        assert (g.policy_version == 0).all() and g.router_indices.shape[1] == len(g.tokens)
    assert holder.update(jax.tree.map(lambda x: x * 1.5, params)) == 1
    assert all((g.policy_version == 1).all() for g in policy(prompts, 8))


def test_eval_harness_drives_the_engine_stream_and_stamps_latency():
    """`run_eval` keeps a stream policy's independent schedule (the clock wraps the stream): per-episode
    latency stamped at engine round-trips, generation seconds summed."""
    from horizon.agent import Generation
    from horizon.eval.harness import _DoneClock

    class Stream:
        def __init__(self):
            self.q, self.released = [], []

        def submit(self, e, ctx, n):
            self.q.append(e)

        def advance(self):
            out, self.q = [(e, Generation(np.zeros(1, np.int32), np.zeros(1, np.float32))) for e in self.q], []
            return out

        def release(self, e):
            self.released.append(e)

        def idle(self, seconds):
            pass

        @property
        def busy(self):
            return bool(self.q)

    class Pol:
        def __call__(self, contexts, n):
            raise AssertionError("a stream policy is not called in lockstep")

        def stream(self):
            return Stream()

    class Ep:
        done = False

    eps = [Ep(), Ep()]
    clock = _DoneClock(Pol(), eps)
    st = clock.stream()
    st.submit(0, None, 1)
    eps[1].done = True
    assert st.busy and len(st.advance()) == 1 and not st.busy
    st.release(0)
    assert 1 in clock.done_at and 0 not in clock.done_at and clock.gen_s >= 0 and st.inner.released == [0]
    assert not callable(getattr(_DoneClock(lambda c, n: [], eps), "stream", None))


def test_replicas_serve_one_stream_like_one_engine(setup):
    """`engine_replicas` = 2 (one `Engine` per device, 2 slots each; tests run on 8 CPU devices):
    every request samples what `generate` samples for it alone; both devices serve; a group's
    identical prompts go to one replica and prefill once; an episode's next turn goes to the replica
    holding its cache and prefills only its new tokens; `stats` sums the replicas."""
    mcfg, params, _ = setup
    ec2 = dataclasses.replace(EC, replicas=2)
    eng = replicas.make_engine(mcfg, engine=ec2, params=params, stop_tokens=())
    assert isinstance(eng, replicas.EngineReplicas) and [e.ec.slots for e in eng.engines] == [2, 2]
    assert len({e.device for e in eng.engines}) == 2
    assert all(set(leaf.devices()) == {e.device} for e in eng.engines for leaf in jax.tree.leaves(e.cache))
    prompts = _prompts(5, seed=6)
    group = _prompts(1, 40, 41, seed=7)[0]
    reqs = [E.Request(p, _seq_key(i), 9) for i, p in enumerate(prompts)]
    reqs += [E.Request(group, _seq_key(5 + g), 9) for g in range(2)]
    out = E.generate_requests(eng, reqs)
    for i, c in enumerate(out):
        ref = _generate_one(setup, reqs[i].context, i, 9)
        np.testing.assert_array_equal(c.tokens, ref.tokens[0])
        np.testing.assert_allclose(c.logprobs, ref.logprobs[0], rtol=0, atol=ATOL)
        np.testing.assert_array_equal(c.router_indices, ref.router_indices[0])
    assert all(e.stats["generated_tokens"] > 0 for e in eng.engines)
    assert sorted(c.prefill_tokens for c in out[5:]) == [0, len(group)]
    assert eng.stats["prefill_tokens"] == sum(len(p) for p in prompts) + len(group)
    ctx1 = _prompts(1, 30, 31, seed=8)[0]
    (c1,) = E.generate_requests(eng, [E.Request(ctx1, _seq_key(9), 6, owner="ep")])
    ctx2 = np.concatenate([ctx1, c1.tokens, prompts[0][:7]])
    for filler in range(3):                  # other traffic in between: the least-loaded rule alone could move it
        E.generate_requests(eng, [E.Request(_prompts(1, 20, 21, seed=20 + filler)[0], _seq_key(20), 4)])
    (c2,) = E.generate_requests(eng, [E.Request(ctx2, _seq_key(10), 6, owner="ep")])
    assert c2.prefill_tokens == 7 and c2.reused_tokens == len(ctx1) + len(c1.tokens)
    _check_against_forward(setup, ctx2, c2)
    eng.release("ep")
    assert all(s.owner != "ep" for e in eng.engines for s in e.slots)


def test_replicas_policy_swaps_weights_and_bad_sizes_raise(setup):
    """`EnginePolicy` builds the replicas from `engine_replicas` (both poll the holder: one version);
    too many replicas for the devices, slots that do not divide, or a replica count on a lone `Engine`
    are one-line errors before any compile."""
    mcfg, params, _ = setup
    holder = sampler.ParamsHolder(params)
    policy = engine_policy.EnginePolicy(holder, mcfg, jax.random.key(0), engine=dataclasses.replace(EC, replicas=2),
                                        stop_tokens=())
    assert isinstance(policy.engine, replicas.EngineReplicas)
    prompts = _prompts(4, seed=9)
    gens = policy(prompts, 6)
    _, sub = jax.random.split(jax.random.key(0))
    ref = sampler.generate(params, prompts, sub, cfg=mcfg, max_new_tokens=6, sampling=NO_STOP)
    for g, t in zip(gens, ref.tokens):
        np.testing.assert_array_equal(g.tokens, t)
    assert holder.update(jax.tree.map(lambda x: x * 1.5, params)) == 1
    assert all((g.policy_version == 1).all() for g in policy(prompts, 6))
    assert policy.state["switches"] == 1 == policy.engine.stats["switches"]
    n = len(jax.local_devices())
    with pytest.raises(ValueError, match=f"need {n + 1} local devices"):
        replicas.make_engine(mcfg, engine=dataclasses.replace(EC, slots=2 * (n + 1), replicas=n + 1), params=params)
    with pytest.raises(ValueError, match="multiple of engine replicas"):
        replicas.make_engine(mcfg, engine=dataclasses.replace(EC, slots=3, replicas=2), params=params)
    with pytest.raises(ValueError, match="one replica"):
        E.Engine(mcfg, engine=dataclasses.replace(EC, replicas=2), params=params)


def test_warm_up_compiles_the_whole_plan_and_changes_no_sample(setup):
    """`inference.warmup`: after `warm_up` the engine compiles nothing while it serves requests that
    touch every window bucket, prefix copies and park-store swaps (the plan is the engine's whole
    compile set), and it samples what an engine that was not warmed samples."""
    from horizon.inference import warmup
    from horizon.utils import compiles

    ec = dataclasses.replace(EC, min_window=256, min_prefill_rows=4, park_tokens=4 * MAX_LEN)
    p = warmup.plan(ec)
    assert (p.windows, p.chunks, p.rows, p.decode_steps) == ((256, 512), (32,), (4,), (8,))
    prompts = _prompts(5, 3, 40, seed=7) + [_prompts(1, 300, 301, seed=8)[0]]   # 6 owners on 4 slots: swaps
    keys = [_seq_key(i) for i in range(len(prompts))]

    def serve(eng):
        out = E.generate_requests(eng, [E.Request(q, k, 12, owner=i) for i, (q, k) in enumerate(zip(prompts, keys))])
        turn2 = [np.concatenate([q, c.tokens, q[:5]]) for q, c in zip(prompts, out)]   # cached prefixes reused
        out += E.generate_requests(eng, [E.Request(q, k, 6, owner=i) for i, (q, k) in enumerate(zip(turn2, keys))])
        return out, eng.stats

    mcfg, params, _ = setup
    cold, _ = serve(E.Engine(mcfg, engine=ec, params=params, stop_tokens=()))
    warm_engine = E.Engine(mcfg, engine=ec, params=params, stop_tokens=())
    assert warmup.warm_up(warm_engine) == len(p.calls())
    c0 = compiles.meter().snapshot()
    warm, stats = serve(warm_engine)
    assert compiles.meter().snapshot().minus(c0).compiles == 0
    assert stats["evictions"] > 0 and stats["reused_tokens"] > 0
    for a, b in zip(cold, warm):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
