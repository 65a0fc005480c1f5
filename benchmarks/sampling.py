"""Sampling throughput: horizon's `sampler.generate` (jitted prefill + decode steps on the MLA latent
cache) vs Hugging Face `generate` (PyTorch eager, DeepseekV3, its KV cache), same weights (docs/SPEC.md §1, §4).

Both sides decode greedily exactly `--new` tokens for `--batch` prompts of `--prompt` random tokens
(no stop token), on configs/small.py scaled like benchmarks/train_step.py (`--layers`, default 2 = 1
dense + 1 MoE), float32. horizon's weights are exported with `hf.export_hf_checkpoint` and
loaded with `from_pretrained`. Tokens/s = batch * new tokens / wall time of one call; `--warmup`
calls excluded (they include XLA compiles), the median of `--reps` calls reported, and the
fraction of greedy tokens on which the two agree (float32 argmax ties aside they should all agree).

    .venv/bin/python benchmarks/sampling.py [--layers 2 --batch 16 --prompt 64 --new 64 --reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import jax  # noqa: E402
import numpy as np  # noqa: E402
from train_step import small_config  # same directory: the benchmark model (sets JAX on CPU, sys.path)

from horizon.inference import sampler  # noqa: E402
from horizon.model import hf, transformer  # noqa: E402
from horizon.utils import progress, provenance  # noqa: E402
from horizon.utils.timing import timed  # noqa: E402


def hf_torch(seed: int):
    """torch, seeded (imported on demand: only the HF columns need it)."""
    import torch

    torch.manual_seed(seed)
    return torch


def hf_model(params: dict, m):
    """horizon `params` (model config `m`) exported with `hf.export_hf_checkpoint` and loaded
    as Hugging Face `DeepseekV3ForCausalLM` (float32, eval mode): the same weights on the HF side."""
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as d:
        hf.export_hf_checkpoint(params, m, d)
        model = transformers.DeepseekV3ForCausalLM.from_pretrained(d, dtype=torch.float32)
    return model.eval()


def hf_generate(model, ids, new: int, *, sample: bool, attention_mask=None, pad_id: int = 0):
    """HF `generate` of exactly `new` tokens per row of `ids` [b, p] (left-padded when
    `attention_mask` marks pads), greedy or sampled at temperature 1, top_p 1; no stop token."""
    import torch

    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0) if sample else dict(do_sample=False)
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              eos_token_id=None, pad_token_id=pad_id, **kw)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sync-tokens", type=int, nargs="+", default=[1, 16],
                    help="decode steps per host sync (`SamplerConfig.sync_tokens`); each value is timed, the last "
                         "is compared with HF (configs/rl_tiny.py's rl.sampler.sync_tokens is 16)")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.warmup < 1 or min(args.batch, args.prompt, args.new) < 1:
        ap.error("--reps, --warmup, --batch, --prompt and --new must be >= 1 (warmup absorbs compilation)")
    provenance.announce(config=vars(args), seeds=args.seed)
    cfg = small_config(args.layers)
    m = cfg.model
    params = transformer.init(jax.random.PRNGKey(args.seed), m)
    prompts = np.random.default_rng(args.seed).integers(0, m.vocab_size, (args.batch, args.prompt)).astype(np.int32)
    ntok = args.batch * args.new
    print(f"config: configs/small.py with num_layers={m.num_layers}, "
          f"experts={m.num_experts} top-{m.num_experts_per_tok}, "
          f"vocab={m.vocab_size}, float32; batch {args.batch} x prompt {args.prompt} + {args.new} new tokens, greedy")

    def run_horizon(sync):
        sc = sampler.SamplerConfig(temperature=0.0, stop_tokens=(), min_batch_bucket=args.batch,
                                   min_prompt_bucket=args.prompt, min_new_bucket=args.new, sync_tokens=sync)
        return sampler.generate(params, list(prompts), jax.random.PRNGKey(1), cfg=cfg, max_new_tokens=args.new,
                                sampling=sc)

    outs = {}
    for sync in progress.progress(args.sync_tokens, desc="horizon generate", unit="sync setting"):
        outs[sync], jt = timed(lambda s=sync: run_horizon(s), args.warmup, args.reps)
        j_med = statistics.median(jt)
        progress.say(f"horizon generate (sync every {sync:3d} tokens): median {j_med * 1e3:8.1f} ms -> "
                     f"{ntok / j_med:8.1f} tokens/s (calls {['%.0f' % (x * 1e3) for x in jt]} ms)")
    out = outs[args.sync_tokens[-1]]
    same = all(np.array_equal(np.stack(o.tokens), np.stack(out.tokens)) for o in outs.values())
    print(f"tokens identical across sync_tokens values: {same}")
    if args.skip_hf:
        return
    torch = hf_torch(args.seed)
    model = hf_model(params, m)
    ids = torch.from_numpy(prompts).long()

    def run_hf():
        return hf_generate(model, ids, args.new, sample=False)

    hout, ht = timed(run_hf, args.warmup, args.reps)
    h_med = statistics.median(ht)
    hf_new = hout[:, args.prompt:].numpy()
    agree = float(np.mean(np.stack(out.tokens) == hf_new))
    print(f"HF generate                          : median {h_med * 1e3:8.1f} ms -> {ntok / h_med:8.1f} tokens/s "
          f"(calls {['%.0f' % (x * 1e3) for x in ht]} ms; torch threads {torch.get_num_threads()})")
    print(f"ratio horizon/HF tokens/s: {h_med / j_med:.2f}x   (greedy tokens identical: {agree:.1%})")


if __name__ == "__main__":
    main()
