"""Chain-of-segments batch layout (docs/SPEC.md §4 "Advantages for summary chains")."""

import numpy as np
import pytest

from horizon.agent import Segment, Trajectory
from horizon.data.tokenizer import ByteTokenizer
from horizon.rl.algo import batch as rlbatch

TOK = ByteTokenizer()
L, K, E = 2, 2, 8


def make_segment(rng, spans):
    """Segment from spans [(kind, length)], kind in {"ctx", "gen"}; BOS first."""
    toks, mask, lps, vers = [TOK.BOS], [False], [0.0], [-1]
    for kind, n in spans:
        toks += rng.integers(0, 256, n).tolist()
        gen = kind == "gen"
        mask += [gen] * n
        lps += (rng.uniform(-3, -0.1, n) if gen else np.zeros(n)).tolist()
        vers += [7 if gen else -1] * n
    ri = np.full((L, len(toks), K), -1, np.int32)
    m = np.asarray(mask)
    ri[:, m] = rng.integers(0, E, (L, int(m.sum()), K))
    return Segment(np.asarray(toks, np.int32), m, np.asarray(lps, np.float32), np.asarray(vers, np.int32), ri)


def make_groups(seed=0, G=3, n_groups=2, end_reason="final"):
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        chains = []
        for j in range(G):
            n_seg = 1 + (j % 2)  # alternate 1- and 2-segment chains (a summary rewrote the context)
            segs = [make_segment(rng, [("ctx", 5 + j), ("gen", 4), ("ctx", 3), ("gen", 2 + g)]) for _ in range(n_seg)]
            chains.append(Trajectory(f"t{g}", segs, "", {}, end_reason if j == 0 else "final"))
        groups.append(chains)
    return groups


def build(groups, rewards, **kw):
    kw = {"min_rows": 8, "min_seq": 16, **kw}
    return rlbatch.build_batch(groups, rewards,
                               rlbatch.BatchConfig(num_moe_layers=L, experts_per_tok=K, pad_id=TOK.pad_id, **kw))


def rows_of(groups):
    return [(gi, j, si, seg) for gi, grp in enumerate(groups) for j, tr in enumerate(grp)
            for si, seg in enumerate(tr.segments)]


def test_mask_alignment_and_padding():
    groups = make_groups()
    b = build(groups, np.zeros((2, 3)), min_rows=16)
    R, S = b["tokens"].shape
    rows = rows_of(groups)
    assert R == 16 and S == 32  # 2 groups x (1+2+1) = 8 segment rows + 8 pad rows; longest 18 tokens -> 32
    for r, (_, _, _, seg) in enumerate(rows):
        n = len(seg.tokens)
        np.testing.assert_array_equal(b["tokens"][r, :n], seg.tokens)
        assert (b["tokens"][r, n:] == TOK.PAD).all() and b["valid"][r].sum() == n
        # loss only on generated tokens: exactly the segment's mask, never prompt/observation/pad
        np.testing.assert_array_equal(b["loss_mask"][r, :n], seg.loss_mask)
        assert not b["loss_mask"][r, n:].any() and not b["loss_mask"][r, 0]
        np.testing.assert_array_equal(b["sampler_logprobs"][r, :n], np.where(seg.loss_mask, seg.logprobs, 0))
        assert (b["policy_versions"][r][b["loss_mask"][r]] == 7).all()
    assert not b["loss_mask"][len(rows):].any() and (b["row_chain"][len(rows):] == -1).all()
    assert b["loss_mask"].sum() == sum(int(s.loss_mask.sum()) for *_, s in rows)


def test_advantage_broadcast_across_segments():
    groups = make_groups()
    rewards = np.array([[1.0, 0.0, 0.5], [0.0, 0.0, 3.0]], np.float32)
    b = build(groups, rewards)
    want_chain = rewards - rewards.mean(1, keepdims=True)  # Dr.GRPO: no std division
    for r, (gi, j, si, _) in enumerate(rows_of(groups)):
        assert b["row_chain"][r] == gi * 3 + j and b["row_group"][r] == gi and b["row_segment"][r] == si
        np.testing.assert_allclose(b["advantages"][r], want_chain[gi, j], rtol=1e-6)
    # every segment row of a 2-segment chain carries the same advantage
    two = [r for r, (gi, j, si, _) in enumerate(rows_of(groups)) if (gi, j) == (0, 1)]
    assert len(two) == 2 and b["advantages"][two[0]] == b["advantages"][two[1]] != 0
    assert (b["advantages"][b["row_chain"] < 0] == 0).all()
    np.testing.assert_allclose(b["group_rewards"][:2], rewards)
    np.testing.assert_allclose(b["chain_advantages"][:6], want_chain.reshape(-1), rtol=1e-6)
    std = build(groups, rewards, std_normalize=True)["chain_advantages"][:6].reshape(2, 3)
    np.testing.assert_allclose(std, want_chain / (rewards.std(1, ddof=1, keepdims=True) + 1e-6), rtol=1e-5)


def test_replay_index_alignment():
    groups = make_groups()
    b = build(groups, np.zeros((2, 3)), min_rows=16)
    R, S = b["tokens"].shape
    rep = b["replay_indices"]
    assert rep.shape == (L, R * S, K)
    for r, (_, _, _, seg) in enumerate(rows_of(groups)):
        n = len(seg.tokens)
        # flattened row-major like transformer.forward's aux (token t of row r at r*S + t)
        np.testing.assert_array_equal(rep[:, r * S: r * S + n], seg.router_indices)
        assert (rep[:, r * S + n: (r + 1) * S] == -1).all()
        gen = b["loss_mask"][r, :n]
        assert (rep[:, r * S: r * S + n][:, gen] >= 0).all() and (rep[:, r * S: r * S + n][:, ~gen] == -1).all()


def test_truncated_flags_and_missing_router_indices():
    groups = make_groups(end_reason="token_budget")
    groups[1][2].segments[0].router_indices = None
    b = build(groups, np.zeros((2, 3)))
    for r, (gi, j, si, _seg) in enumerate(rows_of(groups)):
        assert b["truncated"][r] == (j == 0)
        if (gi, j, si) == (1, 2, 0):
            assert (b["replay_indices"].reshape(L, *b["tokens"].shape, K)[:, r] == -1).all()


def test_bad_inputs_raise():
    groups = make_groups()
    with pytest.raises(ValueError, match="rewards shape"):
        build(groups, np.zeros((2, 2)))
    with pytest.raises(ValueError, match="same size"):
        build([groups[0], groups[1][:2]], np.zeros((2, 3)))
    with pytest.raises(ValueError, match="max_seq"):
        build(groups, np.zeros((2, 3)), max_seq=10)
    with pytest.raises(ValueError, match="finite"):
        build(groups, np.full((2, 3), np.nan))
    bad = make_groups()
    bad[0][0].segments[0].loss_mask[0] = True
    with pytest.raises(ValueError, match="token 0"):
        build(bad, np.zeros((2, 3)))


def test_batch_stats():
    b = build(make_groups(), np.zeros((2, 3)))
    st = rlbatch.batch_stats(b)
    assert st["rows"] == 8 and st["min_policy_version"] == 7 == st["max_policy_version"]
    assert st["generated_tokens"] == int(b["loss_mask"].sum())


def test_split_microbatches_keeps_chains_whole_and_rows_intact():
    groups = make_groups(G=3, n_groups=3)                 # 3 x (1 + 2 + 1) = 12 rows, chains of 1-2 rows
    b = build(groups, np.arange(9.0).reshape(3, 3), min_rows=16)
    s = rlbatch.split_microbatches(b, 3, pad_id=TOK.pad_id)
    M = s["tokens"].shape[0]
    S = b["tokens"].shape[1]
    assert s["tokens"].shape == (M, 3, S) and s["replay_indices"].shape == (M, L, 3 * S, K)
    assert M == 4     # first fit of chain sizes 1,2,1, 1,2,1, 1,2,1: [1+2] [1+1+1] [2+1] [2+1], no padding
    # every real row appears exactly once, unchanged, and all of a chain's rows share a micro-batch
    rep = b["replay_indices"].reshape(L, -1, S, K)
    srep = s["replay_indices"].reshape(M, L, 3, S, K)
    seen = {}
    for m in range(M):
        for r in range(3):
            ci = int(s["row_chain"][m, r])
            if ci < 0:
                assert not s["valid"][m, r].any() and s["advantages"][m, r] == 0
                assert (s["tokens"][m, r] == TOK.PAD).all() and (srep[m, :, r] == -1).all()
                continue
            src = np.flatnonzero((b["row_chain"] == ci) & (b["row_segment"] == s["row_segment"][m, r]))
            assert len(src) == 1
            src = int(src[0])
            for name in rlbatch.ROW_FIELDS:
                np.testing.assert_array_equal(s[name][m, r], b[name][src], err_msg=name)
            np.testing.assert_array_equal(srep[m, :, r], rep[:, src])
            assert seen.setdefault(ci, m) == m, f"chain {ci} split across micro-batches"
    assert sorted(seen) == sorted(set(b["row_chain"][b["row_chain"] >= 0].tolist()))
    assert int((s["row_chain"] >= 0).sum()) == int((b["row_chain"] >= 0).sum())
    for name in ("chain_advantages", "group_rewards", "group_valid"):
        np.testing.assert_array_equal(s[name], b[name])
    assert rlbatch.batch_stats(s)["rows"] == rlbatch.batch_stats(b)["rows"] == 12


def test_split_microbatches_refuses_a_chain_longer_than_a_micro_batch():
    b = build(make_groups(), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="segments > micro_rows=1"):
        rlbatch.split_microbatches(b, 1, pad_id=TOK.pad_id)
    with pytest.raises(ValueError, match="micro_rows must be >= 1"):
        rlbatch.split_microbatches(b, 0, pad_id=TOK.pad_id)


@pytest.mark.parametrize("micro", [0, 2])
def test_batch_shapes_match_built_batches(micro):
    """`batch_shapes` (the abstract batch of horizon.rl.runtime.memory) has `build_batch`'s / the split's
    fields, shapes and dtypes."""
    groups = make_groups(G=3, n_groups=2)
    b = build(groups, [[1.0, 0.0, 0.5], [0.0, 1.0, 1.0]])
    R, S = b["tokens"].shape
    M = 1
    if micro:
        b = rlbatch.split_microbatches(b, micro, pad_id=TOK.pad_id)
        M = b["tokens"].shape[0]
    spec = rlbatch.batch_shapes(R, S, groups=b["group_valid"].shape[0], group_size=3, num_moe_layers=L,
                                experts_per_tok=K, micro_rows=micro, microbatches=M)
    assert spec == {k: (v.shape, v.dtype) for k, v in b.items()}
