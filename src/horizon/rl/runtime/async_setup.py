"""The async runtime's setup from the config (docs/SPEC.md §4, §4.1): starting params,
child-process environment (XLA flags, threads), where groups and weights live, the weight
publisher, and the JSONL logs every process appends to. Shared by the processes (`processes`), the pool
(`ray_pool`), the orchestrator (`orchestrator`) and the config checks (`checks`)."""

from __future__ import annotations

import json
import math
import os
import pathlib

from horizon.inference.remote import ADMIN_TOKEN_ENV
from horizon.model.params import numpy_init
from horizon.parallel.mesh import mesh_sizes
from horizon.rl.runtime import core as runtime
from horizon.rl.runtime import weight_sync
from horizon.rl.runtime.warmstart import load_sft_params
from horizon.utils import compiles


def worker_queue_depth(cfg) -> int:
    """Outstanding slot requests per worker: `async_.queue_depth`, 0 = `rl.prompts_per_step`
    (at least one generation batch, `runtime.batch_slots`)."""
    n = int(cfg.async_.queue_depth)
    return max(n if n > 0 else int(cfg.rl.prompts_per_step), runtime.batch_slots(cfg))


def initial_params(cfg):
    """The policy the run starts from: `async_.init_from` (a finished SFT checkpoint dir, e.g.
    runs/rl_tiny/sft: the same warm start as experiments/rl.py) or, if empty, `numpy_init`."""
    d = str(cfg.async_.get("init_from", "") or "")
    if not d:
        return numpy_init(cfg.model, int(cfg.seed))
    return load_sft_params(cfg, d)


def mesh_devices(cfg) -> int:
    """Devices of the run's mesh (`c.mesh`)."""
    return math.prod(mesh_sizes(cfg.mesh).values())


def child_env(cfg, processes: int = 1) -> dict[str, str]:
    """Environment for JAX child processes: CPU, the run's mesh devices (`c.mesh`: the trainer and
    each rollout worker run their steps on it) split over `processes` JAX processes (a trainer
    group joined by jax.distributed), few threads (shared machine), and the server's admin token
    where the driver has one. A child gets it at process
    start, before its backend reads XLA_FLAGS."""
    n = int(cfg.async_.threads_per_process)
    flags = f"--xla_force_host_platform_device_count={mesh_devices(cfg) // int(processes)}"
    if n == 1:
        flags += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    env = {"XLA_FLAGS": flags, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "OMP_NUM_THREADS": str(n), "OPENBLAS_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}
    if token := os.environ.get(ADMIN_TOKEN_ENV, ""):   # a remote rollout worker loads versions (docs/SERVING.md)
        env[ADMIN_TOKEN_ENV] = token
    return env


def setup_jax(cfg) -> None:
    """The persistent XLA compilation cache (`exp.compilation_cache_dir`), if set."""
    compiles.use_persistent_cache(str(cfg.exp.compilation_cache_dir))


def data_root(cfg, run_dir) -> str:
    """Where a loop's `groups/` and `weights/` live: the run directory, or with `async_.storage_url`
    (an fsspec URL every node sees, e.g. s3://bucket/runs) `<storage_url>/<run dir name>`.
    Checkpoints (orbax, its own path handling) and logs stay in the run directory."""
    url = str(cfg.async_.get("storage_url", "") or "").rstrip("/")
    return str(run_dir) if not url else f"{url}/{pathlib.Path(run_dir).name}"


def make_publisher(cfg, directory) -> weight_sync.WeightPublisher:
    """The trainer's weight publisher on `directory`, configured by `async_`."""
    a = cfg.async_
    return weight_sync.WeightPublisher(directory, dtype=str(a.publish_dtype), codec=str(a.codec),
                                       level=int(a.codec_level), full_every=int(a.full_every),
                                       keep_fulls=int(a.keep_fulls), shard_elems=int(a.shard_elems),
                                       num_threads=int(a.publish_threads))


def append_jsonl(path: pathlib.Path | None, rec: dict) -> None:
    """Append `rec` to the JSONL log `path` and fsync it (a process may be SIGKILLed right after);
    None = do not log."""
    if path is None:            # a trainer group's processes other than 0 do not log
        return
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())
