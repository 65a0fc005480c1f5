"""The async runtime on a real multi-node Ray cluster survives losing a rollout node (docs/SPEC.md §4.1).

`ray.cluster_utils.Cluster` starts a head (the trainer's node: custom resource "trainer") and two
worker nodes (resource "rollout") as separate raylets on this machine; the orchestrator joins it
through `async_.ray_address`, the same code path as a real cluster. The rollout actors run
`make run`'s task family in Docker sandboxes (random init: this pins the runtime, not learning).
Once version 2 is published, the node of rollout worker 0 is removed while it generates: its
actor dies with the node, the orchestrator replaces it on the surviving node and queues the
unfinished slots again. The run must finish with every step training exactly `prompts_per_step`
groups, each slot's group written once and no slot generated again after its group was written.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from horizon.rl.runtime import orchestrator
from horizon.utils.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 6


def _cfg(address: str):
    c = load_config_file(ROOT / "configs" / "rl_async_tiny.py")
    c.async_.init_from = ""                 # random init: no SFT stage in a runtime test
    c.async_.ray_address = address
    c.async_.trainer_resources = "trainer=1"
    c.async_.rollout_resources = "rollout=1"
    c.async_.docker_hosts = "*=unix:///var/run/docker.sock"     # every node's engine by address (one here)
    c.async_.num_rollout_workers = 2
    c.async_.queue_depth = 1
    c.async_.max_staleness = 1
    c.async_.publish_dtype = "float32"
    c.rl.prompts_per_step = 2
    c.rl.slots_per_batch = 1                # single-slot batches: both workers stay busy
    c.rl.group_size = 2
    c.exp.pool_size = 2
    c.exp.steps = STEPS
    c.exp.compilation_cache_dir = str(ROOT / "runs" / "jax_cache")
    return c


@pytest.mark.slow       # ~3-5 min on 2 cores: three raylets, a trainer and two rollout actors with Docker
@pytest.mark.docker
def test_losing_a_rollout_node_mid_run_loses_no_step_and_no_group(tmp_path):
    from ray.cluster_utils import Cluster

    from horizon.sandbox import docker_available

    if not docker_available():
        pytest.skip("no Docker engine answers")
    store = 128 << 20                       # object store per node: only queues' small items live there
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, resources={"trainer": 1},
                                                                object_store_memory=store))
    nodes = [cluster.add_node(num_cpus=1, resources={"rollout": 2}, object_store_memory=store) for _ in range(2)]
    cluster.wait_for_nodes()
    removed = {}

    def remove_node_of_worker_0(orch, version):
        """Once version 2 is out and worker 0 is generating: remove its node (the whole raylet)."""
        busy = any(d.get("state") == "generating" and d.get("worker") == "w0" for d in orch.slots.values())
        if removed or version is None or version < 2 or not busy:
            return
        node_id = orch.pool.worker_nodes()[0]
        node = next(n for n in nodes if n.node_id == node_id)
        removed.update(node=node_id, version=version,
                       lost=sorted(s for s, d in orch.slots.items() if d.get("worker") == "w0"
                                   and d.get("state") in ("requested", "generating", "scored")))
        cluster.remove_node(node, allow_graceful=False)

    run = tmp_path / "run"
    try:
        orch = orchestrator.Orchestrator(_cfg(cluster.address), run, num_steps=STEPS,
                                       fault_hook=remove_node_of_worker_0)
        placed = {}
        start_workers = orch.pool.start_rollout_workers

        def start_and_record(*a, **k):     # where the two rollout actors landed at the start
            start_workers(*a, **k)
            placed["nodes"] = orch.pool.worker_nodes()
        orch.pool.start_rollout_workers = start_and_record
        res = orch.run()
    finally:
        import ray

        ray.shutdown()                       # the pool disconnects too; twice is harmless
        cluster.shutdown()
    worker_node_ids = {n.node_id for n in nodes}
    assert set(placed["nodes"]) == worker_node_ids, "rollout actors must start on both worker nodes"
    assert removed and removed["lost"], "the node must be removed while its worker holds slots"
    assert res["worker_restarts"] >= 1 and res["trainer_restarts"] == 0
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    N = 2
    written = [e["slot"] for e in events if e.get("kind") == "grouped" and e["wrote"]]
    assert sorted(written) == list(range(STEPS * N))              # every slot once, none missing
    done_at = {e["slot"]: i for i, e in enumerate(events) if e.get("kind") == "grouped" and e["wrote"]}
    regenerated = [e["slot"] for i, e in enumerate(events)
                   if e.get("kind") == "generating" and i > done_at.get(e["slot"], len(events))]
    assert not regenerated, f"slots generated again after their group was written: {regenerated}"
    steps_log = {r["step"]: r for r in orchestrator.read_trainer_log(run) if r["event"] == "step"}
    assert sorted(steps_log) == list(range(1, STEPS + 1))
    assert all(len(r["slots"]) == N for r in steps_log.values())
