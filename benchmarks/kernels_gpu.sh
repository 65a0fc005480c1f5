#!/usr/bin/env bash
# Prepared GPU check for the Pallas kernels (SPEC §3); run on an H100/H200 (or B200: tcgen05 path).
# 1) kernel tests (interpret + lowering, CPU-safe parts) 2) correctness + timing vs XLA dots.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -c "import jax; print(jax.devices())"
JAX_PLATFORMS=cpu "$PY" -m pytest pallas_kernels -q -x
"$PY" benchmarks/kernels_gpu.py --sizes "${SIZES:-1024,2048,4096,8192}" --num-sms "${NUM_SMS:-132}" --groups "${GROUPS:-8}" "$@"
