"""The trainer as an actor group joined by jax.distributed (docs/SPEC.md §4.1).

Two Ray actors, 4 fake CPU devices each, form one 2-process JAX job over the run's 8-device mesh
(ep4xcp2: the expert and context axes cross the process boundary). On the same groups they must
reach the params a single 8-device trainer reaches; a lost process makes the whole group restart
from the checkpoint.
"""

from __future__ import annotations

import json
import shutil
import signal

import numpy as np
import pytest

from horizon.rl.runtime import distributed, orchestrator
from horizon.rl.runtime import weight_sync as ws
from horizon.train import checkpoint
from horizon.utils.config import ConfigError
from tests.parallel.conftest import assert_adam_params_close
from tests.rl.test_async import small_cfg, train_only

STEPS = 2


def _cfg(processes: int):
    c = small_cfg(max_staleness=0, num_rollout_workers=1, publish_dtype="float32", poll_s=0.02)
    c.mesh.preset = "ep4xcp2"
    c.async_.trainer_processes = processes
    return c


def test_trainer_processes_must_divide_the_mesh():
    c = _cfg(3)
    from horizon.rl.runtime.checks import validate_async

    with pytest.raises(ConfigError, match="trainer_processes=3: must divide the mesh's 8 devices"):
        validate_async(c)


def test_group_args_and_exitcode():
    assert distributed.group_args(None, 1) == [None]                 # one process: no jax.distributed
    assert distributed.group_args("10.0.0.1:123", 2) == [("10.0.0.1:123", 2, 0), ("10.0.0.1:123", 2, 1)]
    with pytest.raises(ValueError, match="needs a coordinator address"):
        distributed.group_args(None, 2)
    assert distributed.group_exitcode([None, None]) is None          # all running
    assert distributed.group_exitcode([0, None]) == 0                # one finished cleanly, one finishing
    assert distributed.group_exitcode([None, -9]) == -9              # one lost: the group is dead
    assert distributed.group_exitcode([0, 1, -9]) == 1               # the first failure


@pytest.mark.slow     # ~2 min: a rollout run, then a 1-process and a 2-process trainer (gloo collectives)
def test_two_process_trainer_equals_one_process_on_the_same_groups(tmp_path):
    run = tmp_path / "run"
    orchestrator.Orchestrator(_cfg(1), run, num_steps=STEPS).run()       # groups + the 1-process trainer
    two = tmp_path / "two"
    two.mkdir()
    shutil.copytree(run / "groups", two / "groups")
    train_only(_cfg(2), two, STEPS)
    log = orchestrator.read_trainer_log(two)
    start = [r for r in log if r["event"] == "start"]
    assert [(r["processes"], r["local_devices"], r["devices"]) for r in start] == [(2, 4, 8)]   # child_env
    assert [r["step"] for r in log if r["event"] == "step"] == [1, 2]       # process 0 alone logs
    lr = float(_cfg(1).rl.optim.lr)
    a0, b0 = (ws.WeightReceiver(d / "weights").load_flat(0) for d in (run, two))
    assert all(np.array_equal(a0[k], b0[k]) for k in a0)      # the same init, placed from one host value
    worst_abs = worst_rel = 0.0
    for v in range(1, STEPS + 1):
        a = ws.WeightReceiver(run / "weights").load_flat(v)
        b = ws.WeightReceiver(two / "weights").load_flat(v)
        assert sorted(a) == sorted(b)
        for k in a:
            d = np.abs(a[k].astype(np.float64) - b[k])
            worst_abs = max(worst_abs, float(d.max()))
            worst_rel = max(worst_rel, float((d / np.maximum(np.abs(a[k]), lr)).max()))
            # gloo's cross-process all-reduce sums the gradients in another order than one process's
            # 8-device reduction: Adam's tolerance rule for reassociated sums (tests/parallel/conftest.py)
            assert_adam_params_close(b[k], a[k], rtol=1e-4, lr=lr, label=f"version {v} {k}")
    print(f"after {STEPS} steps: max |params(2 processes) - params(1 process)| = {worst_abs:.3g} "
          f"({worst_abs / lr:.2g} lr), max relative (|w| floored at lr) {worst_rel:.3g}")


@pytest.mark.slow     # ~2 min
def test_a_lost_trainer_process_restarts_the_group_from_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    res = orchestrator.Orchestrator(_cfg(2), run, num_steps=3, kill_trainer_at=1).run()
    assert res["trainer_restarts"] == 1
    starts = [r for r in orchestrator.read_trainer_log(run) if r["event"] == "start"]
    assert len(starts) == 2 and starts[1]["restored"] and starts[1]["processes"] == 2
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e.get("kind") == "trainer_restart"]
    assert [e["exitcode"] for e in restarts] == [-int(signal.SIGKILL)]     # the killed process's code
    assert ws.latest_version(run / "weights") == 3
    assert checkpoint.verify_step(run / "ckpt", 3)        # the group's checkpoint, manifest by process 0
