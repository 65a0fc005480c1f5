"""Train-step throughput: horizon (JAX, jitted) vs Hugging Face DeepseekV3 (PyTorch eager), \
same model (docs/SPEC.md §1).

Both sides run one full optimizer step per iteration on the same batch and the same weights (horizon's
init, exported with `hf.export_hf_checkpoint` and loaded with `from_pretrained`):

* horizon: `horizon.train.lm.jit_train_step` = forward + next-token CE + backward + AdamW (+ grad
  clipping and the router-bias update), jitted, float32.
* HF: `DeepseekV3ForCausalLM(input_ids, labels=input_ids).loss.backward()`, `clip_grad_norm_`,
  `torch.optim.AdamW.step()` with horizon's lr schedule, float32 (no router-bias update: HF keeps
  `e_score_correction_bias` as a frozen buffer), the library's default kernels (sdpa attention; the experts
  implementation it selects is printed).

Shapes: configs/small.py (d_model 512, 8 heads, MLA 256/128 ranks, 32 experts top-4 in 4 groups,
vocab 32768), scaled to CPU with flags: `--layers` (default 2 = 1 dense + 1 MoE instead of 8),
`--seq` (default 128 instead of 512) and `--batch` (default 4 instead of 16). Tokens/s counts
batch * seq input tokens per step; one run, `--warmup` steps excluded (includes XLA compile), the
median of `--steps` timed steps is reported.

FLOPs: the compiled step's `cost_analysis()` FLOPs against the analytic count
(`horizon.model.params.train_step_flops`: 6 x active non-embedding params x tokens + attention + LM
head), and the achieved useful FLOP/s (analytic / step time) of both sides as a fraction of this
machine's float32 matmul peak, measured in the same run (`--peak-n`: a jitted n x n x n matmul).

    .venv/bin/python benchmarks/train_step.py [--layers 2 --seq 128 --batch 4 --steps 5 --warmup 2]
    .venv/bin/python benchmarks/train_step.py --seq 2048 --skip-hf --head-chunk 0 2048   # A/B, interleaved
    .venv/bin/python benchmarks/train_step.py --seq 2048 --skip-hf --baseline   # vs dense attention + full logits

On a GPU, a config at its own shapes and dtypes, without HF, against the measured bf16 peak
and the spec peak (`--spec-peak`, TFLOP/s), with a MoE precision recipe and grouped-GEMM implementation:

    JAX_PLATFORMS=cuda python3 benchmarks/train_step.py --config configs/v2_lite.py --skip-hf \
        --peak-dtype bfloat16 --peak-n 8192 --spec-peak 989 [--precision mxfp8] [--grouped-impl block]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from horizon.model import hf, params  # noqa: E402
from horizon.quant import grouped  # noqa: E402
from horizon.train import lm, optim  # noqa: E402
from horizon.utils import progress, provenance, timing  # noqa: E402
from horizon.utils.config import load_config_file  # noqa: E402


def small_config(layers: int):
    """configs/small.py with `layers` layers (first dense), float32: the CPU benchmark model
    (benchmarks/sampling.py uses it too)."""
    cfg = load_config_file(ROOT / "configs" / "small.py")
    m = cfg.model
    m.num_layers = layers
    m.first_k_dense = min(m.first_k_dense, layers)
    m.dtype = m.param_dtype = "float32"
    return cfg


def make_config(args):
    """configs/small.py scaled to CPU (module docstring), or `--config` at its own shapes; flags override."""
    if args.config is None:
        cfg = small_config(args.layers or 2)
        cfg.data.seq_len, cfg.data.batch_size = args.seq or 128, args.batch or 4
    else:
        cfg = load_config_file(args.config)
        if args.layers:
            cfg.model.num_layers = args.layers
            cfg.model.first_k_dense = min(cfg.model.first_k_dense, args.layers)
        cfg.data.seq_len = args.seq or cfg.data.seq_len
        cfg.data.batch_size = args.batch or cfg.data.batch_size
    if args.precision:
        cfg.model.moe_precision = args.precision
    if args.grouped_impl:
        cfg.model.grouped_impl = args.grouped_impl
    return cfg


# The previous path (`--baseline`): dense [seq, seq] attention and full [tokens, vocab] logits.
BASELINE = {"attention_kernel": "dense", "head_chunk": 0}


def variant(cfg, **model_fields):
    """`cfg` with these ``model`` fields replaced (a copy)."""
    c = cfg.copy_and_resolve_references()
    for k, v in model_fields.items():
        c.model[k] = v
    return c


def variants(cfg, args) -> list[tuple[str, object]]:
    """(label, config) of every variant the run times: one per `--head-chunk` (else the config), plus
    the previous path with `--baseline`."""
    out = [(f"head_chunk={n}", variant(cfg, head_chunk=int(n))) for n in args.head_chunk or []]
    out = out or [("", cfg)]
    if args.baseline:
        out.append(("previous path (dense attention, full logits)", variant(cfg, **BASELINE)))
    return out


def matmul_peak(n: int, reps: int = 5, dtype=jnp.float32) -> float:
    """This machine's matmul FLOP/s in JAX for `dtype`: the best of `reps` timed n x n x n products on
    random data (two input sets alternated, so a repeat does not reuse a cached product)."""
    xs = [(jax.random.normal(jax.random.PRNGKey(i), (n, n), dtype),) for i in range(2)]
    return 2.0 * n ** 3 / timing.best_seconds(jax.jit(lambda x: x @ x), xs, reps)


def compiled_flops(cfg, tokens: np.ndarray, args) -> float:
    """`cost_analysis()` FLOPs of the jitted train step for these shapes (what XLA really runs)."""
    state = jax.eval_shape(lambda: lm.init_state(jax.random.PRNGKey(args.seed), cfg))
    b, s = tokens.shape
    i32 = jax.ShapeDtypeStruct((b, s), jnp.int32)
    batch = {"tokens": i32, "segment_ids": i32, "positions": i32, "mask": i32}
    with grouped.count_flops():       # the expert tile loops counted tile by tile (cost_analysis counts a loop once)
        return float(lm.jit_train_step(cfg).lower(state, batch).compile().cost_analysis()["flops"])


def bench_horizon(cfgs, tokens: np.ndarray, args):
    """Timed steps of `lm.jit_train_step` for each config in `cfgs` (variants of one model), one state
    each, from the same init; the steps alternate between the variants (round-robin), so load drift
    on a shared machine hits every variant alike. Returns (params0, [(times, losses, first step) per
    config])."""
    b, s = tokens.shape
    batch = {"tokens": jnp.asarray(tokens), "segment_ids": jnp.zeros((b, s), jnp.int32),
             "positions": jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s)),
             "mask": jnp.ones((b, s), jnp.int32)}
    states = [lm.init_state(jax.random.PRNGKey(args.seed), c) for c in cfgs]
    steps = [lm.jit_train_step(c) for c in cfgs]
    params0 = states[0].params
    out = [([], [], 0.0) for _ in cfgs]
    for i in progress.progress(range(args.warmup + args.steps), desc="horizon train steps", unit="step"):
        for j, step in enumerate(steps):
            t0 = time.perf_counter()
            states[j], metrics = step(states[j], batch)
            jax.block_until_ready(states[j].params)
            dt = time.perf_counter() - t0
            times, losses, first = out[j]
            losses.append(float(metrics["loss"]))
            if i >= args.warmup:
                times.append(dt)
            out[j] = (times, losses, first or dt)
    return params0, out


def bench_hf(cfg, params0, tokens: np.ndarray, args):
    import torch
    import transformers

    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as d:
        hf.export_hf_checkpoint(params0, cfg.model, d)
        model = transformers.DeepseekV3ForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.train()
    t = cfg.train
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=(t.b1, t.b2), eps=t.eps, weight_decay=t.weight_decay)
    sched = optim.lr_schedule(t)  # horizon's warmup/cosine schedule, so both runs take the same steps
    ids = torch.from_numpy(tokens).long()
    times, losses = [], []
    for i in progress.progress(range(args.warmup + args.steps), desc="HF train steps", unit="step"):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = float(sched(i))
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(float(loss.detach()))
        if i >= args.warmup:
            times.append(dt)
    impl = f"attn={model.config._attn_implementation}, experts={model.config._experts_implementation}"
    return times, losses, impl, torch.get_num_threads()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None, help="a configs/*.py (default: configs/small.py scaled to CPU)")
    ap.add_argument("--layers", type=int, default=None, help="default 2 (small.py), else the config's")
    ap.add_argument("--seq", type=int, default=None, help="default 128 (small.py), else the config's")
    ap.add_argument("--batch", type=int, default=None, help="default 4 (small.py), else the config's")
    ap.add_argument("--precision", default=None, help="model.moe_precision (default: the config's)")
    ap.add_argument("--grouped-impl", default=None, help="model.grouped_impl (default: the config's)")
    ap.add_argument("--head-chunk", type=int, nargs="+", default=None,
                    help="model.head_chunk (tokens per LM-head chunk, 0 = full logits; default: the config's); "
                         "several values: one variant each, their steps interleaved")
    ap.add_argument("--baseline", action="store_true",
                    help="also time the previous path (model.attention_kernel=dense, head_chunk=0), interleaved")
    ap.add_argument("--peak-dtype", default="float32", help="dtype of the matmul peak measurement")
    ap.add_argument("--spec-peak", type=float, default=0.0, help="the datasheet peak in TFLOP/s (0: not shown)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-flops", action="store_true", help="no compiled-FLOP count (saves one compile)")
    ap.add_argument("--peak-n", type=int, default=2048, help="matmul size of the float32 peak measurement")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be >= 1 (warmup absorbs compilation)")
    provenance.announce(config=vars(args), seeds=args.seed)

    cfg = make_config(args)
    m = cfg.model
    batch, seq = cfg.data.batch_size, cfg.data.seq_len
    tokens = np.random.default_rng(args.seed).integers(0, m.vocab_size, (batch, seq)).astype(np.int32)
    ntok = batch * seq
    print(f"config: {args.config or 'configs/small.py'} with num_layers={m.num_layers} "
          f"(first_k_dense={m.first_k_dense}), seq={seq}, batch={batch}, d_model={m.d_model}, "
          f"experts={m.num_experts} top-{m.num_experts_per_tok}, vocab={m.vocab_size}, {m.dtype}, "
          f"head_chunk={args.head_chunk or m.get('head_chunk', 0)}, attention={m.get('attention_kernel')} "
          f"(blocks {m.get('attention_block_q')} x {m.get('attention_block_kv')}), "
          f"moe_precision={m.moe_precision}, grouped_impl={m.get('grouped_impl', 'auto')} "
          f"({grouped.choose_impl(m.get('grouped_impl', 'auto'))}); devices={jax.devices()}")

    peak = matmul_peak(args.peak_n, dtype=jnp.dtype(args.peak_dtype))
    ana = params.train_step_flops(cfg, batch, seq)
    print(f"{args.peak_dtype} matmul peak ({args.peak_n}^3 in JAX): {peak / 1e9:.1f} GFLOP/s")
    if not args.skip_flops:
        t0 = time.perf_counter()
        comp = compiled_flops(cfg, tokens, args)
        print(f"FLOPs per step: compiled {comp:.3g} vs analytic {ana['total']:.3g} = {comp / ana['total']:.2f}x "
              f"(analytic: matmul {ana['matmul']:.3g}, attention {ana['attention']:.3g}, lm_head "
              f"{ana['lm_head']:.3g}; FLOP-count compile {time.perf_counter() - t0:.1f} s)")
    vs = variants(cfg, args)
    params0, runs = bench_horizon([c for _, c in vs], tokens, args)
    for (label, _), (jt, jl, _) in zip(vs, runs):
        j_med = statistics.median(jt)
        print(f"horizon JAX {label}: median step {j_med * 1e3:8.1f} ms  "
              f"-> {ntok / j_med:9.1f} tokens/s  {ana['total'] / j_med / 1e9:6.1f} useful GFLOP/s = "
              f"{ana['total'] / j_med / peak:.0%} of peak  "
              f"(steps {['%.0f' % (x * 1e3) for x in jt]} ms; loss {jl[0]:.4f} -> {jl[-1]:.4f})")
    jt, jl, jt0 = runs[0]
    j_med = statistics.median(jt)
    if args.baseline:
        b_med = statistics.median(runs[-1][0])
        print(f"ratio {vs[0][0] or 'current path'} / previous path step time: {j_med / b_med:.3f}x "
              f"(first-step loss diff {abs(jl[0] - runs[-1][1][0]):.2e})")
    if args.spec_peak:
        print(f"MFU (analytic FLOPs / step time): {ana['total'] / j_med / peak:.1%} of the measured "
              f"{args.peak_dtype} peak ({peak / 1e12:.0f} TFLOP/s), "
              f"{ana['total'] / j_med / (args.spec_peak * 1e12):.1%} "
              f"of the {args.spec_peak:.0f} TFLOP/s spec peak; first step (compile + run) {jt0:.1f} s")
    if args.skip_hf:
        return
    ht, hl, impl, threads = bench_hf(cfg, params0, tokens, args)
    h_med = statistics.median(ht)
    print(f"HF PyTorch  : median step {h_med * 1e3:8.1f} ms  -> {ntok / h_med:9.1f} tokens/s  "
          f"{ana['total'] / h_med / 1e9:6.1f} useful GFLOP/s = {ana['total'] / h_med / peak:.0%} of peak  "
          f"(steps {['%.0f' % (x * 1e3) for x in ht]} ms; loss {hl[0]:.4f} -> {hl[-1]:.4f}; {impl}; "
          f"torch threads {threads})")
    print(f"ratio horizon/HF tokens/s: {h_med / j_med:.2f}x   "
          f"(same weights: first-step loss diff {abs(jl[0] - hl[0]):.2e})")


if __name__ == "__main__":
    main()
