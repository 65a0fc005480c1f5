"""Multi-process path: 2 CPU processes x 4 devices form one 8-device mesh via jax.distributed (docs/SPEC.md §2).

Each process runs `_worker`: `jax.distributed.initialize`, the global ep4xcp2 mesh, its local half of
the batch via `jax.make_array_from_process_local_data`, the sharded forward (CP + EP shard_maps with
cross-process all-gather / all-to-all over gloo), and compares with its own single-device forward."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_default_matmul_precision", "highest")
    pid, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
    import numpy as np, jax.numpy as jnp
    from horizon.model import transformer
    from horizon.parallel import mesh as pmesh, sharded
    from tests.parallel.conftest import make_batch, mesh_cfg
    assert jax.device_count() == 8 and jax.local_device_count() == 4
    cfg = mesh_cfg("ep4xcp2")
    mesh = pmesh.make_mesh(cfg.mesh)
    params = transformer.init(jax.random.key(0), cfg.model)          # same on both processes
    b = make_batch()
    ref, _ = jax.jit(lambda p, t, q, s: transformer.forward(p, t, cfg=cfg.model, positions=q, segment_ids=s),
                     device=jax.local_devices()[0])(params, b["tokens"], b["positions"], b["segment_ids"])
    sh = pmesh.batch_sharding(mesh)
    half = slice(4 * pid, 4 * pid + 4)                                # this process's rows
    glob = [jax.make_array_from_process_local_data(sh, b[k][half]) for k in ("tokens", "positions", "segment_ids")]
    fwd = sharded.make_forward(cfg, mesh, params)
    p_sh = jax.device_put(params, pmesh.param_shardings(params, sharded.configure(cfg), mesh))
    logits, _ = fwd(p_sh, *glob)
    from jax.experimental import multihost_utils
    got = np.asarray(multihost_utils.process_allgather(logits, tiled=True))  # the global [8, S, V]
    err = float(np.max(np.abs(got - np.asarray(ref))))
    print("MAXERR", err, flush=True)
    sys.exit(0 if 0 <= err < 1e-4 else 3)
""")


@pytest.mark.slow
def test_two_process_cpu_mesh(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.path.join(root, "src")]))
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port)], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
        assert "MAXERR" in out
