"""Where a study step's time goes, and compile once (docs/PERF.md): the compile meter, the step's time
split, the accumulated step's length buckets and the chains' placement in micro-batches."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from horizon.rl.algo import accumulate
from horizon.rl.algo import batch as rlbatch
from horizon.rl.runtime import steptime
from horizon.utils import compiles


def test_meter_counts_a_compile_and_its_function_once():
    m = compiles.meter()
    f = jax.jit(lambda x: jnp.cos(x) * 3.0 + 1.0)
    x = jnp.ones((7, 13))
    a = m.snapshot()
    f(x)
    b = m.snapshot()
    f(x)                                       # cached: nothing new
    d = b.minus(a)
    assert d.compiles >= 1 and d.seconds > 0 and any(n == "jit(<lambda>)" and c == 1 for n, _, c in d.by_name)
    assert m.snapshot().minus(b).compiles == 0
    assert set(d.record("x/")) == {"x/count", "x/s", "x/cache_hits", "x/cache_misses"}


def test_step_split_adds_up():
    """`steptime.split`: the rollout's wall = engine (exec + compile) + idle on tools + host; the
    train's = exec + compile + host; occupancy = generated tokens per decode slot-step."""
    rc = compiles.Compiles(compiles=3, seconds=2.0)
    tc = compiles.Compiles(compiles=1, seconds=1.5, cache_hits=1)
    usage = dict(gen_s=5.0, tool_wait_s=1.0, slot_steps=400, engine_tokens=100)
    r = steptime.split(rollout_s=10.0, train_s=4.0, usage=usage, rollout_c=rc, train_c=tc, train_host_s=0.5)
    assert r["time/compile_s"] == 3.5 and r["time/compiles"] == 4 and r["time/compile_cache_hits"] == 1
    assert r["time/gen_exec_s"] + r["time/rollout_compile_s"] + r["time/tool_wait_s"] + r["time/rollout_host_s"] == 10.0
    assert r["time/train_exec_s"] + r["time/train_compile_s"] + r["time/train_host_s"] == 4.0
    assert r["engine/occupancy"] == 0.25
    assert "occupancy 0.25" in steptime.line(r)
    assert steptime.add_usage(steptime.add_usage({}, usage), usage)["slot_steps"] == 800


def _cfg(min_seq=32, max_context=200, max_seq_len=256):
    return ml_collections.ConfigDict(dict(model=dict(max_seq_len=max_seq_len),
                                          agent=dict(max_context_tokens=max_context),
                                          rl=dict(batch=dict(min_seq=min_seq))))


def test_seq_buckets_span_min_seq_to_the_longest_segment():
    assert accumulate.seq_buckets(_cfg()) == (32, 64, 128, 256)
    assert accumulate.seq_buckets(_cfg(min_seq=256, max_context=480, max_seq_len=512)) == (256, 512)


def _split(lengths, micro_rows):
    """A split batch of one-segment chains of `lengths` tokens (a hand-built `build_batch` layout)."""
    R, S, L, k = len(lengths), 64, 1, 2
    b = {name: np.zeros((R, S), np.int32) for name in ("tokens", "policy_versions", "row_segment")}
    b.update(valid=np.zeros((R, S), bool), loss_mask=np.zeros((R, S), bool), truncated=np.zeros(R, bool),
             sampler_logprobs=np.zeros((R, S), np.float32), advantages=np.zeros(R, np.float32),
             row_chain=np.arange(R, dtype=np.int32), row_group=np.zeros(R, np.int32),
             replay_indices=np.arange(L * R * S * k, dtype=np.int32).reshape(L, R * S, k),
             chain_advantages=np.zeros(R, np.float32), group_rewards=np.zeros((1, R), np.float32),
             group_valid=np.ones(1, bool))
    for r, n in enumerate(lengths):
        b["valid"][r, :n] = True
        b["tokens"][r, :n] = 1 + r
    return rlbatch.split_microbatches(b, micro_rows, pad_id=0), b


def test_micro_batches_group_chains_by_length_and_cut_to_their_bucket():
    """Chains go to micro-batches longest first, so the short ones share one that the trainer cuts to a
    short length bucket; the cut drops only columns no row uses, and the replay indices move with
    their tokens."""
    s, whole = _split([10, 60, 12, 50, 9, 14], micro_rows=2)
    firsts = [sorted(int(t) for t in s["tokens"][m, :, 0]) for m in range(3)]
    assert firsts == [[2, 4], [3, 6], [1, 5]]                 # (60, 50), (12, 14), (10, 9)
    cut = [accumulate.micro_batch(s, m, (16, 32, 64)) for m in range(3)]
    assert [c["tokens"].shape for c in cut] == [(2, 64), (2, 16), (2, 16)]
    for m, c in enumerate(cut):
        S = c["tokens"].shape[1]
        np.testing.assert_array_equal(c["tokens"], s["tokens"][m][:, :S])
        assert not s["valid"][m][:, S:].any()
        rep = s["replay_indices"][m].reshape(1, 2, 64, 2)[:, :, :S].reshape(1, 2 * S, 2)
        np.testing.assert_array_equal(c["replay_indices"], rep)
    assert accumulate.micro_batch(s, 0, (16, 32))["tokens"].shape == (2, 64)   # no bucket holds it: whole


def test_weights_and_combine_match_whole_batch_means():
    """`combine` reproduces the whole batch's numbers from per-micro-batch ones: loss terms weighted by
    `weights`, counts summed, maxima and minima kept, token means weighted by their token counts."""
    s, _ = _split([10, 60, 12, 50], micro_rows=2)
    cfg = ml_collections.ConfigDict(dict(rl=dict(loss_agg="token_sum", token_sum_norm=0.0, overlong_mask=False,
                                                 std_normalize=False, std_unbiased=True, adv_std_eps=1e-6,
                                                 clip_eps=0.0, kl_coef=0.0, kl_estimator="k1", kl_mode="reward",
                                                 stale=dict(tis_cap=0.0, token_mask_cap=0.0, seq_mask_cap=0.0))))
    w = accumulate.weights(s, cfg)
    np.testing.assert_allclose(w, [0.5, 0.5])                 # 2 real rows each
    parts = [dict(loss=1.0, num_tokens=10.0, ratio_max=1.5, min_policy_version=3.0, tokens=70.0, entropy=2.0,
                  kl_k1=0.1, adv_mean=0.2),
             dict(loss=3.0, num_tokens=30.0, ratio_max=1.2, min_policy_version=1.0, tokens=22.0, entropy=4.0,
                  kl_k1=0.3, adv_mean=0.4)]
    got = accumulate.combine(parts, w, mask_counts=np.array([1.0, 3.0]))
    assert got["loss"] == 2.0 and got["num_tokens"] == 40.0 and got["tokens"] == 92.0
    assert got["ratio_max"] == 1.5 and got["min_policy_version"] == 1.0
    np.testing.assert_allclose([got["entropy"], got["kl_k1"], got["adv_mean"]], [3.5, 0.25, 0.3])


def test_train_plans_of_the_committed_configs():
    """`rl.runtime.warmup.train_plan`: `make run` trains one shape (32 one-segment rows of 256 tokens);
    the study's accumulated step one micro-batch shape per length bucket, 64 rows each."""
    import pathlib

    from horizon.rl.runtime import warmup
    from horizon.utils.config import load_config_file

    root = pathlib.Path(__file__).resolve().parents[2]
    assert [(s.rows, s.seq, s.micro_rows) for s in warmup.train_plan(load_config_file(root / "configs/rl_tiny.py"))] \
        == [(32, 256, 0)]
    ss = warmup.train_plan(load_config_file(root / "configs/selfsum_tiny.py"))
    assert [(s.seq, s.micro_rows, s.microbatches) for s in ss] == [(256, 64, 1), (512, 64, 1)]
