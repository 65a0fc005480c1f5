"""The trainer as an actor group joined by jax.distributed (issue 23, SPEC §4).

Two Ray actors, 4 fake CPU devices each, form one 2-process JAX job over the run's 8-device mesh
(ep4xcp2: the expert and context axes cross the process boundary). On the same groups they must
reach the params a single 8-device trainer reaches; a lost process makes the whole group restart
from the checkpoint.
"""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pytest

from horizon.rl.runtime import async_loop
from horizon.rl.runtime import weight_sync as ws
from horizon.utils.config import ConfigError

from tests.parallel.conftest import assert_adam_params_close
from tests.rl.test_async import small_cfg

STEPS = 2


def _cfg(processes: int):
    c = small_cfg(max_staleness=0, num_rollout_workers=1, publish_dtype="float32", poll_s=0.02)
    c.mesh.preset = "ep4xcp2"
    c.async_.trainer_processes = processes
    return c


def _train_only(c, run: pathlib.Path) -> None:
    pool = async_loop.make_pool("ray", c)
    try:
        pool.start_trainer(c, str(run), STEPS)
        assert pool.wait_trainer(600) == 0
    finally:
        pool.close()


def test_trainer_processes_must_divide_the_mesh():
    c = _cfg(3)
    from horizon.rl.checks import validate_async

    with pytest.raises(ConfigError, match="trainer_processes=3: must divide the mesh's 8 devices"):
        validate_async(c)


@pytest.mark.slow     # ~2 min: a rollout run, then a 1-process and a 2-process trainer (gloo collectives)
def test_two_process_trainer_equals_one_process_on_the_same_groups(tmp_path):
    run = tmp_path / "run"
    async_loop.Orchestrator(_cfg(1), run, num_steps=STEPS).run()       # groups + the 1-process trainer
    two = tmp_path / "two"
    two.mkdir()
    shutil.copytree(run / "groups", two / "groups")
    _train_only(_cfg(2), two)
    log = async_loop.read_trainer_log(two)
    assert [r["processes"] for r in log if r["event"] == "start"] == [2]
    assert [r["step"] for r in log if r["event"] == "step"] == [1, 2]       # process 0 alone logs
    worst = 0.0
    lr = float(_cfg(1).rl.optim.lr)
    for v in range(STEPS + 1):
        a = ws.WeightReceiver(run / "weights").load_flat(v)
        b = ws.WeightReceiver(two / "weights").load_flat(v)
        assert sorted(a) == sorted(b)
        for k in a:
            worst = max(worst, float(np.abs(a[k].astype(np.float64) - b[k]).max()))
            # the cross-process all-reduce reassociates the gradient sums: Adam's tolerance rule
            assert_adam_params_close(b[k], a[k], rtol=1e-4, lr=lr, label=f"version {v} {k}")
    print(f"max |params(2 processes) - params(1 process)| over {STEPS} steps: {worst:.3g}")


@pytest.mark.slow     # ~2 min
def test_a_lost_trainer_process_restarts_the_group_from_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    res = async_loop.Orchestrator(_cfg(2), run, num_steps=3, kill_trainer_at=1).run()
    assert res["trainer_restarts"] == 1
    starts = [r for r in async_loop.read_trainer_log(run) if r["event"] == "start"]
    assert len(starts) == 2 and starts[1]["restored"] and starts[1]["processes"] == 2
    assert ws.latest_version(run / "weights") == 3
