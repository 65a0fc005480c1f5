"""RL runs on the mesh of its config (docs/SPEC.md §2, §4): from one SFT checkpoint and the same fixed groups,
2 RL steps (`runtime.resume_rl_state` + `runtime.train_groups`: global sequence packing, then the one
`trainer.train_step`) on `ep4xcp2` reach the single-device params; the RL checkpoint written on the
mesh restores onto one device with identical values; the packed rows balance the 4 data-parallel
ranks; the sampler's rollouts on the mesh are the single-device ones."""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from horizon.data.tokenizer import ByteTokenizer
from horizon.model.params import numpy_init
from horizon.parallel import mesh as pmesh
from horizon.parallel import packing
from horizon.rl.algo import batch as rlbatch
from horizon.rl.runtime import core as runtime
from horizon.rl.runtime import warmstart, workers
from horizon.train.checkpoint import Checkpointer
from horizon.utils.config import load_config_file
from tests.parallel.conftest import assert_adam_params_close

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 2


def _cfg(preset: str):
    c = load_config_file(ROOT / "configs" / "rl_async.py")       # the toy env: no sandbox
    c.model.num_layers, c.model.d_model = 2, 32                   # 1 dense + 1 MoE layer: small compiles
    c.rl.group_size, c.rl.prompts_per_step = 4, 4                 # 16 rows: 4 per data-parallel rank
    c.rl.optim.warmup_steps = 0
    c.rl.kl_coef = 1e-3                                           # the reference forward runs on the mesh too
    c.async_.toy_max_new_tokens = 32
    c.exp.steps = STEPS
    c.mesh.preset = preset
    return c


@pytest.fixture(scope="module")
def setup(tmp_path_factory, need8):
    """The shared SFT checkpoint (written on one device, as experiments/rl.py's SFT stage does) and the
    fixed groups of 2 steps, rolled out on one device from it."""
    tmp = tmp_path_factory.mktemp("rl_mesh")
    c1 = _cfg("")
    init = numpy_init(c1.model, 3)
    ck = Checkpointer(tmp / "sft", every=1, keep=1)
    ck.save(1, {"params": init}, {"step": 1}, force=True)
    ck.close()
    params = warmstart.load_sft_params(c1, tmp / "sft")
    sched = runtime.PromptSchedule(c1, STEPS, lag=0)
    tok, env, steps = ByteTokenizer(c1.model.vocab_size), workers.ToyEnv(c1), []
    for t in range(STEPS):
        sched.assign(t)
        groups = [g for reqs in sched.batches(t) for g in runtime.rollout_groups(env, reqs, lambda t=t: (params, t), c1,
                                                                                 tok)[0]]
        sched.feed(t, groups)
        steps.append(groups)
    return tmp, params, steps


def _train(c, params, steps, directory):
    state, ck, meta = runtime.resume_rl_state(params, c, directory)
    assert meta is None
    recs = []
    for t, groups in enumerate(steps):
        state, m, _ = runtime.train_groups(state, groups, c)
        recs.append(m)
        ck.save(t + 1, state, {"step": t + 1}, force=True)
    ck.close()
    return state, recs


def test_two_rl_steps_on_ep4xcp2_equal_single_device(setup):
    tmp, params, steps = setup
    c1, c8 = _cfg(""), _cfg("ep4xcp2")
    s1, r1 = _train(c1, params, steps, tmp / "ck1")
    s8, r8 = _train(c8, params, steps, tmp / "ck8")
    # the mesh run really is sharded: expert weights split over `expert`, dense weights over (context, expert)
    assert len(s8.params["embed"].sharding.device_set) == 8 and not s8.params["embed"].sharding.is_fully_replicated
    assert r1[0]["pack/ranks"] == 1 and r8[0]["pack/ranks"] == 4
    for a, b in zip(r1, r8):
        # float32; the mesh run sums rows in another order (packed, split over ranks, all-reduced) and
        # the EP / CP paths reassociate the MoE and attention sums: ~1e-6 relative
        for k in ("grad_norm", "entropy", "logprob_mean"):
            np.testing.assert_allclose(b[k], a[k], rtol=1e-4, err_msg=k)
        # the Dr.GRPO loss is a near-cancelling sum of +-advantage terms (the group-mean baseline): its
        # error scale is that of the terms, not of the sum
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-4, atol=1e-4 * a["adv_abs_mean"])
        # k1 KL vs the reference: at step 1 policy == reference, so it is pure roundoff (~1e-9)
        np.testing.assert_allclose(b["kl_k1"], a["kl_k1"], rtol=1e-4, atol=1e-7)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(s1.params), jax.tree.leaves(s8.params), strict=True):
        assert_adam_params_close(y, x, rtol=1e-4, lr=float(c1.rl.optim.lr), label=jax.tree_util.keystr(path))
    # the params moved (the comparison is not between two copies of the init)
    assert any(np.abs(np.asarray(x) - np.asarray(y)).max() > 0
               for x, y in zip(jax.tree.leaves(s1.params), jax.tree.leaves(params)))

    # the checkpoint written on ep4xcp2 restores onto one device with identical values
    back, _, meta = runtime.resume_rl_state(params, c1, tmp / "ck8")
    assert int(meta["step"]) == STEPS
    for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(s8), strict=True):
        assert len(x.sharding.device_set) == 1
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # ... and its params load in a process that has one device only (eval, a later warm start)
    np.save(tmp / "want.npy", np.asarray(s8.params["embed"]))
    code = ("import numpy as np, jax; from horizon.train.checkpoint import restore_params; "
            "from tests.parallel.test_rl_mesh import _cfg; assert len(jax.devices()) == 1; "
            f"p, _ = restore_params({str(tmp / 'ck8')!r}, _cfg('').model); "
            f"np.testing.assert_array_equal(np.asarray(p['embed']), np.load({str(tmp / 'want.npy')!r}))")
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_packing_balances_a_logged_rl_steps_rows_over_4_ranks(setup):
    _, _, steps = setup
    c8 = _cfg("ep4xcp2")
    # both fixed steps' groups as one step of 8 prompts x 4 samples: 32 rows, 8 per rank
    groups = sorted(steps[0] + steps[1], key=lambda g: g.slot)
    b = rlbatch.build_batch_from_config([g.trajectories for g in groups],
                                        np.asarray([g.rewards for g in groups], np.float32), c8)
    packed, st = runtime.pack_rows(b, c8)
    lengths = np.asarray(b["valid"]).sum(axis=1)
    print(f"rows {sorted(lengths.tolist())}: imbalance over 4 ranks {st['pack/imbalance']:.4f} "
          f"(naive {st['pack/imbalance_naive']:.4f})")
    assert st["pack/ranks"] == 4 and st["pack/imbalance"] <= 1.05
    assert st["pack/imbalance"] <= st["pack/imbalance_naive"]
    # the same rows, reordered: every row field moved together, replay indices with their rows
    order = np.argsort(np.asarray(packed["row_chain"]) * 1000 + np.asarray(packed["row_segment"]), kind="stable")
    src = np.argsort(np.asarray(b["row_chain"]) * 1000 + np.asarray(b["row_segment"]), kind="stable")
    for k in rlbatch.ROW_FIELDS:
        np.testing.assert_array_equal(np.asarray(packed[k])[order], np.asarray(b[k])[src], err_msg=k)
    L, _, kk = b["replay_indices"].shape
    R, S = b["tokens"].shape
    np.testing.assert_array_equal(packed["replay_indices"].reshape(L, R, S, kk)[:, order],
                                  b["replay_indices"].reshape(L, R, S, kk)[:, src])
    # the cost is attention-aware: a row twice as long costs more than twice as much
    cost = packing.model_cost_model(c8.model)
    assert cost(200) > 2 * cost(100) and cost.b > 0


def test_rollouts_on_the_mesh_are_the_single_device_ones(setup):
    _, params, steps = setup
    c8 = _cfg("ep4xcp2")
    assert pmesh.data_ranks(c8) == 4
    reqs = [dict(slot=g.slot, prompt_id=g.prompt_id, seed=g.slot) for g in sorted(steps[0], key=lambda g: g.slot)]
    n, env, tok = runtime.batch_slots(c8), workers.ToyEnv(c8), ByteTokenizer(c8.model.vocab_size)
    groups = [g for i in range(0, len(reqs), n)     # the fixture's generation batches (same sampling keys)
              for g in runtime.rollout_groups(env, reqs[i:i + n], lambda: (params, 0), c8, tok)[0]]
    for a, b in zip(sorted(steps[0], key=lambda g: g.slot), groups, strict=True):
        assert a.rewards == b.rewards
        for ta, tb in zip(a.trajectories, b.trajectories, strict=True):
            for sa, sb in zip(ta.segments, tb.segments, strict=True):
                np.testing.assert_array_equal(sa.tokens, sb.tokens)
                np.testing.assert_array_equal(sa.router_indices, sb.router_indices)
                # float32 logits, reduction order differs across the split batch / gathered weights
                np.testing.assert_allclose(sa.logprobs, sb.logprobs, rtol=1e-5, atol=1e-5)
