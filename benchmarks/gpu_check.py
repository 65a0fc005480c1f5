"""The prepared GPU check: one script for a lent H100/H200, prioritised, each part time-capped.

Runs with the device's own `python3` (JAX with CUDA; `ml_collections` carried as a wheel) from the repo
root. The parts run in order, each in its own process under its own time cap, and write to `--out`
(default `$OUT`) as they go, so a part that hangs or fails costs only its cap and the rest still run:

  env      versions, `nvidia-smi` (clocks, power, temperature), the measured bf16 and per-tensor FP8
           matmul peaks (8192^3 on random data) and the device-to-device copy bandwidth
  kernels  `benchmarks/kernels_gpu.py`: every Hopper kernel vs its reference and both XLA baselines
  moe      `benchmarks/grouped_gemm.py`: the MoE layer's expert GEMMs, grouped GEMM vs `ragged_dot`
  train    `benchmarks/train_step.py --config configs/v2_lite.py`, bf16, with the faster grouped GEMM
           of `moe` (by forward+backward time)
  tests    `pytest -m gpu pallas_kernels` (the kernel tests that need a GPU)
  train_mxfp8, train_nvfp4   the train step with `model.moe_precision` mxfp8 and
           nvfp4_per_token_fwd_mxfp8_bwd

horizon is not pip-installed on the device, so the kernel package's entry point
(`horizon.quant_kernels`, setup.cfg) is provided by a generated `.dist-info` on PYTHONPATH: the
`moe_precision` recipes then take the Pallas kernels exactly as an installed package would.

    python3 benchmarks/gpu_check.py --out $OUT [--parts env,kernels] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable
sys.path.insert(0, str(ROOT / "src"))  # horizon is not pip-installed on the device

from horizon.utils import progress, provenance  # noqa: E402

# (name, time cap in seconds): the order is the priority.
PARTS = (("env", 60), ("kernels", 170), ("moe", 150), ("train", 150), ("tests", 150), ("train_mxfp8", 110),
         ("train_nvfp4", 110))

ENV_PROBE = r"""
import json, jax, jax.numpy as jnp
d = jax.devices()[0]
out = {"jax": jax.__version__, "device": d.device_kind, "platform": d.platform,
       "compute_capability": getattr(d, "compute_capability", None), "sms": getattr(d, "core_count", None)}
try:
    import jaxlib; out["jaxlib"] = jaxlib.__version__
except Exception: pass
from horizon.utils.timing import best_seconds   # PYTHONPATH has src/ (main below)
best = lambda f, xs: best_seconds(f, xs, reps=10)
n = 8192
def measure(name, fn):
    try:
        out[name] = fn()
    except Exception as e:
        out[name] = f"failed: {type(e).__name__}: {str(e)[:300]}"
ks = jax.random.split(jax.random.key(0), 4)
bf = [(jax.random.normal(ks[i], (n, n), jnp.bfloat16), jax.random.normal(ks[i + 2], (n, n), jnp.bfloat16))
      for i in range(2)]
measure("bf16_peak_tflops", lambda: 2 * n**3 / best(jax.jit(lambda a, b: a @ b), bf) / 1e12)
f8 = [(a.astype(jnp.float8_e4m3fn), b.astype(jnp.float8_e4m3fn)) for a, b in bf]
dot8 = jax.jit(lambda a, b: jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16))
measure("fp8_per_tensor_peak_tflops", lambda: 2 * n**3 / best(dot8, f8) / 1e12)
def target():
    hlo = dot8.lower(*f8[0]).compile().as_text()
    return ("cublas$lt$matmul$f8" if "$f8" in hlo
            else [l.strip()[:160] for l in hlo.splitlines() if "custom-call" in l][:3])
measure("fp8_gemm", target)
x = [(jax.random.normal(ks[i], (1 << 28,), jnp.float32),) for i in range(2)]   # 1 GiB
measure("copy_GBps", lambda: 2 * x[0][0].nbytes / best(jax.jit(lambda v: v * 1.0001), x) / 1e9)
print(json.dumps(out))
"""


def entry_point_shim(tmp: pathlib.Path) -> pathlib.Path:
    """A `.dist-info` that registers `pallas_kernels.dispatch:KERNELS` as the installed package would."""
    d = tmp / "horizon_gpu_check-0.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: horizon-gpu-check\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text("[horizon.quant_kernels]\npallas = pallas_kernels.dispatch:KERNELS\n")
    return tmp


def smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,"
                               "memory.used", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi unavailable: {e}"


def best_grouped_impl(moe_json: pathlib.Path) -> str:
    """The grouped-GEMM implementation with the lowest forward+backward time in the moe part ("block" if none)."""
    best, name = float("inf"), "block"
    if moe_json.exists():
        for line in moe_json.read_text().splitlines():
            r = json.loads(line)
            if r.get("pass") == "fwd+bwd" and r.get("seconds", float("inf")) < best:
                best, name = r["seconds"], r["impl"]
    return name


def commands(out: pathlib.Path, scale: float, kernels_list: str) -> dict[str, list[str]]:
    train = [PY, "benchmarks/train_step.py", "--skip-hf", "--spec-peak", "989", "--steps", "4", "--warmup", "1"]
    if scale < 1:
        train += ["--config", "configs/small.py", "--layers", "2", "--seq", "128", "--batch", "2"]
    else:
        train += ["--config", "configs/v2_lite.py", "--peak-dtype", "bfloat16", "--peak-n", "8192"]
    impl = best_grouped_impl(out / "moe.jsonl")
    moe = [PY, "benchmarks/grouped_gemm.py", "--json", str(out / "moe.jsonl")]
    if scale < 1:
        moe += ["--tokens", "1024", "--experts", "16", "--d", "512", "--f", "256", "--dtype", "float32"]
    kernels = [PY, "benchmarks/kernels_gpu.py", "--json", str(out / "kernels.jsonl"), "--kernels", kernels_list]
    if scale < 1:
        kernels += ["--interpret"]
    return {
        "env": [PY, "-c", ENV_PROBE],
        "kernels": kernels,
        "moe": moe,
        "train": train + ["--grouped-impl", impl, "--skip-flops"],
        "tests": [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "gpu", "-rA",
                  "pallas_kernels"],
        "train_mxfp8": train + ["--precision", "mxfp8", "--skip-flops"],
        "train_nvfp4": train + ["--precision", "nvfp4_per_token_fwd_mxfp8_bwd", "--skip-flops"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    p.add_argument("--parts", default=",".join(n for n, _ in PARTS))
    p.add_argument("--cap-scale", type=float, default=1.0, help="multiply every part's time cap")
    p.add_argument("--caps", default="", help="per-part caps in seconds, e.g. kernels=45,train=120")
    p.add_argument("--scale", type=float, default=1.0, help="< 1: tiny shapes (a CPU check of this script)")
    p.add_argument("--kernels", default="mxfp8,nvfp4,grouped,quantize", help="kernels_gpu.py --kernels")
    args = p.parse_args(argv)
    provenance.announce(config=vars(args))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "gpu_check.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")  # the v2_lite train step keeps two states
    env.setdefault("JAX_PLATFORMS", "")  # JAX's default (the GPU): train_step.py defaults to cpu otherwise
    paths = [str(ROOT / "src"), str(ROOT)]
    from importlib.metadata import entry_points
    if not list(entry_points(group="horizon.quant_kernels")):  # not pip-installed (the device machine)
        paths.append(str(entry_point_shim(pathlib.Path("/tmp/horizon_gpu_check_ep"))))
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    caps = dict(PARTS)
    caps.update({k: float(v) for k, v in (c.split("=") for c in args.caps.split(",") if c)})
    wanted = args.parts.split(",")
    unknown = [w for w in wanted if w not in caps]
    if unknown:
        p.error(f"unknown parts {unknown}; known: {list(caps)}")
    t_start = time.time()
    with open(log, "a") as fh:
        def say(msg: str) -> None:
            line = f"[{time.time() - t_start:6.1f}s] {msg}"
            progress.say(line)
            fh.write(line + "\n")
            fh.flush()

        say(f"gpu_check start {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; python {sys.version.split()[0]}; "
            f"smi: {smi()}")
        for name in progress.progress([n for n, _ in PARTS if n in wanted], desc="gpu_check parts", unit="part"):
            cmd = commands(out, args.scale, args.kernels)[name]
            cap = caps[name] * args.cap_scale
            say(f"== {name} (cap {cap:.0f} s): {' '.join(cmd[:3])} ...")
            t0 = time.time()
            try:
                r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=cap)
                text, rc = r.stdout + r.stderr, r.returncode
            except subprocess.TimeoutExpired as e:
                text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                text += ((e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or ""))
                rc = "timeout"
            with open(out / "parts.txt", "a") as pf:  # one file: the device returns at most 8
                pf.write(f"\n===== {name} rc={rc} =====\n{text}")
            keep = [ln for ln in text.splitlines() if not ln.startswith("  File ")]
            for ln in keep[-40:]:
                fh.write(f"    {ln}\n")
            progress.say("\n".join(keep[-30:]))
            say(f"== {name}: rc={rc} in {time.time() - t0:.1f} s; smi: {smi()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
