"""The Hopper roofline's arithmetic by hand (docs/KERNELS.md "Roofline"), and its benchmark on the recorded runs."""

import importlib.util
import json
import pathlib

import pytest

from pallas_kernels import roofline

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_promotion_against_the_mma_by_hand():
    # MX: per 32-wide block an accumulator element gets 32 FP8 FMAs (32 / 4096 clocks of an SM's tensor core) and
    # 2 FP32 instructions (2 / 128 clocks of its issue): promotion takes twice the MMA's time
    assert roofline.promotion_ratio("mxfp8") == pytest.approx((2 / 128) / (32 / 4096)) == pytest.approx(2.0)
    assert roofline.fraction_of_fp8_peak("mxfp8", mode="overlapped") == pytest.approx(0.5)
    assert roofline.fraction_of_fp8_peak("mxfp8", mode="serialized") == pytest.approx(1 / 3)
    # DeepGEMM's per-128 blocks with one fused add: a quarter of the MMA time, hidden when overlapped
    assert roofline.fraction_of_fp8_peak("k128_deepgemm", mode="overlapped") == 1.0
    assert roofline.fraction_of_fp8_peak("nvfp4_fp8_promotion", mode="overlapped") == pytest.approx(0.25)


def test_nvfp4_decode_by_hand():
    # a 64 x 128 tile decodes 64 + 128 elements per K step (2 instructions each: 384 / 128 = 3 clocks) against
    # 64 * 128 BF16 FMAs (8192 / 2048 = 4 clocks): 0.75, hidden when overlapped, so BF16's half of the FP8 peak
    assert roofline.decode_ratio(2.0, 64, 128) == pytest.approx(3 / 4)
    assert roofline.fraction_of_fp8_peak("nvfp4", mode="overlapped", decode_ops=2.0) == pytest.approx(0.5)
    assert roofline.fraction_of_fp8_peak("nvfp4", mode="serialized", decode_ops=2.0) == pytest.approx(0.5 / 1.75)
    assert roofline.fraction_of_fp8_peak("nvfp4", mode="overlapped", decode_ops=4.0) == pytest.approx(0.5 / 1.5)
    with pytest.raises(ValueError, match="mode must be one of"):
        roofline.fraction_of_fp8_peak("mxfp8", mode="pipelined")


def test_grouped_waste_counts_one_extra_visit_per_boundary():
    assert roofline.grouped_waste(32768, 32, 64) == pytest.approx((512 + 31) / 512)
    assert roofline.grouped_waste(64, 1, 64) == 1.0


def test_the_benchmark_rates_every_recorded_matmul(capsys):
    spec = importlib.util.spec_from_file_location("kernel_roofline", REPO / "benchmarks" / "kernel_roofline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--json"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    timed = [r for r in (json.loads(x) for f in sorted((REPO / "docs/gpu/2026-12-04").glob("*-kernels.jsonl"))
                         for x in f.read_text().splitlines()) if "tflops" in r]
    assert len(recs) == 2 * len(timed) and {r["mode"] for r in recs} == set(roofline.MODES)
    best = max(recs, key=lambda r: r["of_ceiling_datasheet"])
    assert best["kernel"] == "mxfp8_dense" and best["of_ceiling_datasheet"] < 0.7     # no kernel reaches the goal
