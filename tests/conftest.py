"""Shared pytest setup: 8 fake CPU devices (for mesh tests), deterministic f32 math, and the
`sandbox` fixture of the tool and agent tests (real LocalSandbox and, docker-marked, DockerSandbox on
`horizon-sandbox:base`; tests/sandbox overrides it with its own)."""

import os
import pathlib
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import pytest  # noqa: E402

from horizon.sandbox.factory import docker_available, open_sandbox  # noqa: E402

BASE_IMAGE = "horizon-sandbox:base"


def _docker_or_skip():
    if not docker_available():
        pytest.skip("NO DOCKER ENGINE ANSWERS: docker-marked sandbox tests skipped")
    import docker

    try:
        docker.from_env().images.get(BASE_IMAGE)
    except Exception:
        pytest.skip(f"IMAGE {BASE_IMAGE} MISSING: build it with envs/build_base_image.sh")


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    if request.param == "docker":
        _docker_or_skip()
        sb = open_sandbox("docker", BASE_IMAGE)
    else:
        sb = open_sandbox("local")
    yield sb
    sb.close()


def _wandb_records(path):
    """The records of a W&B transaction log (`run-*.wandb`): LevelDB's log format (32 KiB blocks of
    chunks with a 7-byte header: crc32, length, type full/first/middle/last) after a 7-byte file
    header, each record a `wandb_internal_pb2.Record`. W&B ships no Python reader for it."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:                       # block trailer: padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            yield rec


@pytest.fixture
def wandb_runs():
    """`read(out_dir)` -> [(run name, group, [history rows {key: value}])] of the offline W&B runs
    that `horizon.utils.tracking.MetricsWriter` left in out_dir/wandb."""
    import json

    def parse(f):
        name, group, rows = None, None, []
        for r in _wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                name, group = r.run.display_name, r.run.run_group
            elif kind == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        return name, group, rows

    def read(out_dir):
        runs = []
        for f in sorted(pathlib.Path(out_dir).glob("wandb/offline-run-*/run-*.wandb")):
            # W&B's service process writes the log; on a loaded machine its run record has been seen
            # land after `finish()` returned, so wait for it (bounded) rather than read a partial file.
            deadline = time.monotonic() + 60
            run = parse(f)
            while run[0] is None and time.monotonic() < deadline:
                time.sleep(0.5)
                run = parse(f)
            runs.append(run)
        return runs
    return read


def _tensorboard_equals_jsonl(run_dir: pathlib.Path, jsonl: str = "metrics.jsonl", keep=lambda r: True) -> int:
    """Every finite number of every record of run_dir/jsonl is TensorBoard scalar <phase>/<key> at the
    record's step (float32: the event files store 32-bit values), and TensorBoard holds no other
    record scalars. Records `keep(record)` rejects are not the writer's (the async trainer's start and
    done markers). Returns the number of values compared."""
    import json

    import numpy as np

    from horizon.utils.tracking import read_scalars, scalars

    recs = [json.loads(x) for x in (run_dir / jsonl).read_text().splitlines()]
    want: dict[str, list] = {}
    for r in recs:
        if r.get("run") or not keep(r):
            continue                       # a study run's records are in their own event directory
        phase = r.get("phase", "")
        for k, v in scalars(r).items():
            if k not in ("step", "time_s"):
                want.setdefault(f"{phase}/{k}" if phase else k, []).append((int(r["step"]), v))
    got = {t: v for t, v in read_scalars(run_dir).items() if not t.startswith("final/")}
    assert set(got) == set(want), set(got) ^ set(want)
    for tag, pts in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in pts], tag
        np.testing.assert_array_equal(np.float32([v for _, v in got[tag]]), np.float32([v for _, v in pts]), tag)
    return sum(len(p) for p in want.values())


@pytest.fixture
def tensorboard_equals_jsonl():
    """`check(run_dir, jsonl="metrics.jsonl")`: a run's TensorBoard scalars equal its JSONL records."""
    return _tensorboard_equals_jsonl


def _load_script(relpath: str):
    """A repository script (experiments/*.py, benchmarks/*.py) as a module, its `main` callable in-process."""
    import importlib.util

    path = pathlib.Path(__file__).resolve().parents[1] / relpath
    spec = importlib.util.spec_from_file_location(path.stem + "_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def load_script():
    """`load_script("experiments/rl.py")`: the script as a module (drivers run in-process by tests)."""
    return _load_script
