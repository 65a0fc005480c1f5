"""Rollout engine vs the lockstep `generate` path (docs/SPEC.md §4, §6): prints measured numbers.

Three workloads, each timed after a warm-up pass of the same shapes (XLA compiles excluded), fresh
random prompts per timed repetition (so the engine cannot reuse the previous repetition's cache):

1. **raw** (configs/tiny.py, `--batch` prompts of 32-96 random tokens, no two sharing a first token nor
   one with the previous repetition's, exactly `--new` sampled tokens each, no stop ids): generated
   tokens/s of `sampler.generate` as `make run` configures it
   (configs/rl_tiny.py's `rl.sampler`: buckets 32 / 128 / 128, 16 steps per sync), of the same with a
   host sync after every token (what `generate` did before its multi-token device loop), of `generate` with \
the tightest buckets, of the engine (`engine.Engine`,
   `rl.sampler.engine_*`), of `--replicas` data-parallel engine replicas (`replicas.EngineReplicas`, one
   per CPU device: the process is given that many) and of Hugging Face `generate` with the same weights \
(`--skip-hf` leaves it
   out; `benchmarks/sampling.py`'s export). The same per-sequence keys: horizon's samples must be
   identical (printed). `--baseline-tree DIR` adds another checkout's `generate` on the same prompts
   (`benchmarks/generate_at_tree.py`): the path the engine replaced, against its ">= 3x" goal.
2. **staggered** (`--stream` requests, budgets uniform in [8, `--new`], as a policy whose rows stop at
   different lengths): `generate` on batches of `--batch` decodes until its longest row is done (the
   lockstep path: a batch waits for its slowest row), the engine refills a slot as soon as its
   request ends. Useful (budgeted) tokens/s.
3. **multi-turn** (`--episodes` episodes in groups of `--group` sharing a prompt, `--turns` turns
   of `--new` generated tokens + a `--obs`-token observation each, then a rewrite (the context
   replaced by prompt + a 32-token summary, as self-summarization does) and one more turn): rollout
   wall time and prefill tokens computed; the old path prefills every turn's whole context, the
   engine only what no cache holds (per-episode caches across turns, one prefill per group prompt),
   also with `--replicas` (whose routing must keep that reuse: the same prefill tokens).
4. **agent** (`--episodes` key-recall episodes of configs/selfsum_tiny.py through `run_episodes`, local
   or `--backend docker` sandboxes, per `--strategies`): a lockstep `generate` policy vs the engine's
   independent path; untrained weights, so turns are malformed calls (see `agent`).

    .venv/bin/python benchmarks/rollout_engine.py [--batch 32 --new 64 --reps 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import sampling  # noqa: E402  (same directory: the HF export and generate of benchmarks/sampling.py)

from horizon.inference import engine as E  # noqa: E402
from horizon.inference import policy as engine_policy  # noqa: E402
from horizon.inference import replicas as R  # noqa: E402
from horizon.inference import sampler  # noqa: E402
from horizon.model.params import numpy_init  # noqa: E402
from horizon.utils import progress, provenance, timing  # noqa: E402
from horizon.utils.config import load_config_file  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PROMPT_LEN = (32, 96)          # random prompt lengths of the raw / staggered workloads
SETTLE_S = 0.3                 # idle time before each interleaved call: the other process's XLA threads stop spinning
SUMMARY_LEN = 32               # the multi-turn workload's rewrite: prompt + this many summary tokens


def config():
    """configs/tiny.py's model with configs/rl_tiny.py's sampler section (what make run samples with)."""
    c = load_config_file(os.path.join(ROOT, "configs", "rl_tiny.py"))
    c.model = load_config_file(os.path.join(ROOT, "configs", "tiny.py")).model
    return c


def prompts(rng, n, lo=PROMPT_LEN[0], hi=PROMPT_LEN[1], vocab=256, first_block=None):
    """`n` random prompts of `lo`..`hi` tokens; with `first_block` b (n <= vocab / 4) their first tokens
    are distinct ids from block b mod 4 of the vocabulary, so no prompt is a prefix-cache hit for another
    nor for what the previous call (block b - 1) left in the engine's slots (the raw workload: each
    repetition then runs the shapes the warm-up compiled, and neither path reuses a cache; a 1-token
    same-slot hit had shifted a row's chunks into a prefill shape no warm-up compiled)."""
    out = [rng.integers(0, vocab, size=int(k)).astype(np.int32) for k in rng.integers(lo, hi + 1, size=n)]
    if first_block is not None:
        w = vocab // 4
        if n > w:
            raise ValueError(f"first_block: at most {w} prompts (a quarter of the {vocab}-token vocabulary), got {n}")
        for p, first in zip(out, (first_block % 4) * w + rng.permutation(w)[:n]):
            p[0] = first
    return out


def request_keys(key, n: int) -> list:
    """`generate`'s per-sequence keys for `n` rows (`sampler.sequence_keys`) as raw key data, one
    device call for all: indexing a device key array once per request cost ~0.3 ms each (11 ms of a
    ~75 ms raw run, cProfile), caller overhead rather than engine time. `Request` takes raw keys."""
    return list(np.asarray(jax.random.key_data(sampler.sequence_keys(key, n))))


def timed(fn, make_input, warmup: int, reps: int):
    """(median s, all, last output) of fn(make_input(r)) (`horizon.utils.timing.timed`: fresh inputs, untimed)."""
    out, ts = timing.timed(fn, warmup, reps, make_input=make_input)
    return statistics.median(ts), ts, out


def fmt(ts):
    return "[" + ", ".join(f"{t * 1e3:.0f}" for t in ts) + "] ms"


def raw(c, params, args):
    sc = sampler.sampler_config(c, stop_tokens=())
    tight = dataclasses.replace(sc, min_batch_bucket=1, min_prompt_bucket=16, min_new_bucket=16, sync_tokens=args.new)
    n = args.batch
    mk = lambda r: prompts(np.random.default_rng(r), n, first_block=r)   # noqa: E731
    gen = lambda s: lambda p: sampler.generate(params, p, jax.random.key(1), cfg=c, max_new_tokens=args.new,  # noqa: E731
                                               sampling=s)
    eng = E.Engine(c, params=params, stop_tokens=())
    reps = R.make_engine(c, params=params, stop_tokens=(), replicas=args.replicas) if args.replicas > 1 else None
    ks = request_keys(jax.random.key(1), n)            # the same keys every repetition (as `generate` derives them)

    def run_engine(p, engine=eng):
        return E.generate_requests(engine, [E.Request(x, ks[i], args.new) for i, x in enumerate(p)])

    run_reps = (lambda p: run_engine(p, reps)) if reps is not None else None   # noqa: E731

    ntok = n * args.new
    progress.say(f"\n[raw] configs/tiny.py ({c.model.num_layers} layers, {c.model.num_experts} experts top-"
                 f"{c.model.num_experts_per_tok}, f32), batch {n} x prompts {PROMPT_LEN[0]}-{PROMPT_LEN[1]} "
                 f"+ {args.new} sampled tokens (temperature 1, no stop ids)")
    res = {}
    buckets = f"buckets {sc.min_batch_bucket}/{sc.min_prompt_bucket}/{sc.min_new_bucket}, sync {sc.sync_tokens}"
    rows = [(f"generate, make run's rl.sampler ({buckets})", gen(sc)),
            ("generate, host sync every token (the path before the device loop)",
             gen(dataclasses.replace(sc, sync_tokens=1))),
            (f"generate, tightest buckets (16/16, sync {args.new})", gen(tight)),
            (f"engine ({eng.ec.slots} slots, sync {eng.ec.sync_tokens}, window >= {eng.ec.min_window})", run_engine)]
    if reps is not None:
        rows.append((f"engine, {args.replicas} replicas ({eng.ec.slots // args.replicas} slots each, "
                     "one per CPU device)", run_reps))
    for name, fn in progress.progress(rows, desc="raw workload", unit="path", leave=False):
        med, ts, out = timed(fn, mk, args.warmup, args.reps)
        res[name] = (med, out)
        progress.say(f"  {name:70s}: {ntok / med:8.0f} tokens/s  (median {med * 1e3:.0f} ms; {fmt(ts)})")
    (old_med, old_out), (sync1_med, sync1_out), (_, tight_out), (eng_med, eng_out), *rest = res.values()
    same = all(np.array_equal(a, b.tokens) for a, b in zip(old_out.tokens, eng_out)) and all(
        np.array_equal(a, b) and np.array_equal(a, c)
        for a, b, c in zip(old_out.tokens, tight_out.tokens, sync1_out.tokens))
    if rest:
        same = same and all(np.array_equal(a, b.tokens) for a, b in zip(old_out.tokens, rest[0][1]))
        progress.say(f"  engine, {args.replicas} replicas / make-run generate: {old_med / rest[0][0]:.2f}x")
    progress.say(f"  engine / make-run generate: {old_med / eng_med:.2f}x; engine / per-token-sync generate: "
                 f"{sync1_med / eng_med:.2f}x   (samples identical, same per-sequence keys: {same})")
    if args.baseline_tree:
        tree_raw(args, mk, run_engine, run_reps, ntok)
    if not args.skip_hf:
        hf_med = hf_raw(c, params, args, mk)
        progress.say(f"  engine / HF generate: {hf_med / eng_med:.2f}x")


class TreeGenerate:
    """Another checkout's `generate` in a subprocess (`benchmarks/generate_at_tree.py`), one timed call
    per `__call__` (seconds measured in the subprocess, outside the prompt transfer)."""

    def __init__(self, tree: str, new: int):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generate_at_tree.py")
        self.tmp = tempfile.TemporaryDirectory()
        self.err = open(os.path.join(self.tmp.name, "stderr.txt"), "w+")   # a file: a full pipe would block it
        self.proc = subprocess.Popen([sys.executable, script, "--tree", tree, "--new", str(new)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.err.seek(0)
            raise SystemExit(f"generate_at_tree.py failed:\n{self.err.read()[-2000:]}")
        return json.loads(line)

    def __call__(self, prompts) -> float:
        path = os.path.join(self.tmp.name, "prompts.npz")
        np.savez(path, **{f"p{j}": x for j, x in enumerate(prompts)})
        self.proc.stdin.write(path + "\n")
        self.proc.stdin.flush()
        return self._read()["s"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
        self.err.close()
        self.tmp.cleanup()


def tree_raw(args, mk, run_engine, run_reps, ntok):
    """The engine (and its replicas, `run_reps`, unless None) against another checkout's `generate`
    (`--baseline-tree`) on the same prompts, their repetitions **interleaved** (engine, replicas,
    baseline, engine, ...) so slow drift of the machine's speed (measured: the same engine run 70-120 ms
    minutes apart on this 2-core VM) hits all alike. Prints the medians, the ratios of medians and the
    medians of the per-repetition ratios."""
    base = TreeGenerate(args.baseline_tree, args.new)
    engines = [("engine", run_engine)] + ([(f"engine, {args.replicas} replicas", run_reps)] if run_reps else [])
    try:
        for w in range(args.warmup):
            for _, fn in engines:
                fn(mk(10_000 + w))
            base(mk(10_000 + w))
        eng_t, base_t = {name: [] for name, _ in engines}, []
        for r in range(args.reps):
            for name, fn in engines:
                p = mk(r)                     # fresh arrays, same prompts; each engine's previous call was block r - 1
                time.sleep(SETTLE_S)
                t0 = time.perf_counter()
                fn(p)
                eng_t[name].append(time.perf_counter() - t0)
            time.sleep(SETTLE_S)
            base_t.append(base(mk(r)))
    finally:
        base.close()
    bm = statistics.median(base_t)
    name = f"generate at {args.baseline_tree} ({base.info['rev']}, its make-run rl.sampler)"
    progress.say(f"  interleaved with it, {args.reps} repetitions each:")
    for e, ts in eng_t.items():
        progress.say(f"    {e:68s}: {ntok / statistics.median(ts):8.0f} tokens/s  "
                     f"(median {statistics.median(ts) * 1e3:.0f} ms; {fmt(ts)})")
    progress.say(f"    {name:68s}: {ntok / bm:8.0f} tokens/s  (median {bm * 1e3:.0f} ms; {fmt(base_t)})")
    for e, ts in eng_t.items():
        paired = statistics.median(b / t for b, t in zip(base_t, ts))
        progress.say(f"  {e} / baseline-tree generate: {bm / statistics.median(ts):.2f}x "
                     f"(median of per-repetition ratios {paired:.2f}x; the engine's raw goal: >= 3x)")


def hf_raw(c, params, args, mk):
    """The raw workload through Hugging Face `generate` (DeepseekV3, PyTorch eager, its KV cache) with
    the same weights (`benchmarks/sampling.py`'s export): prompts left-padded with an attention mask,
    sampled at temperature 1. Returns the median seconds per call."""
    torch = sampling.hf_torch(0)
    model = sampling.hf_model(params, c.model)

    def left_padded(r):
        p = mk(r)
        width = max(len(x) for x in p)
        ids = torch.zeros((len(p), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, x in enumerate(p):
            ids[i, width - len(x):] = torch.from_numpy(x.astype(np.int64))
            mask[i, width - len(x):] = 1
        return ids, mask

    med, ts, _ = timed(lambda im: sampling.hf_generate(model, im[0], args.new, sample=True, attention_mask=im[1]),
                       left_padded, args.warmup, args.reps)
    name = f"HF generate (DeepseekV3, torch {torch.get_num_threads()} threads, sampled)"
    progress.say(f"  {name:70s}: {args.batch * args.new / med:8.0f} tokens/s  (median {med * 1e3:.0f} ms; {fmt(ts)})")
    return med


def staggered(c, params, args):
    rng = np.random.default_rng(7)
    budgets = rng.integers(8, args.new + 1, size=args.stream)
    sc = sampler.sampler_config(c, stop_tokens=())
    B = args.batch
    mk = lambda r: prompts(np.random.default_rng(100 + r), args.stream)     # noqa: E731
    useful = int(budgets.sum())

    def old(p):   # lockstep: each batch decodes until its longest row ends (the rows' stops, here budgets)
        out = []
        for s in range(0, len(p), B):
            g = sampler.generate(params, p[s:s + B], jax.random.key(s), cfg=c,
                                 max_new_tokens=int(budgets[s:s + B].max()), sampling=sc)
            out += [t[:b] for t, b in zip(g.tokens, budgets[s:s + B])]
        return out

    eng = E.Engine(c, params=params, stop_tokens=())

    def new(p):
        keys = [request_keys(jax.random.key(s), B) for s in range(0, len(p), B)]
        reqs = [E.Request(x, keys[i // B][i % B], int(budgets[i])) for i, x in enumerate(p)]
        return [o.tokens for o in E.generate_requests(eng, reqs)]

    progress.say(f"\n[staggered] {args.stream} requests, budgets uniform in [8, {args.new}] ({useful} tokens), "
                 f"batches / slots of {B}")
    o_med, o_ts, o_out = timed(old, mk, args.warmup, args.reps)
    e_med, e_ts, e_out = timed(new, mk, args.warmup, args.reps)
    progress.say(f"  {'generate in lockstep batches (make run rl.sampler)':70s}: {useful / o_med:8.0f} tokens/s  "
                 f"({fmt(o_ts)})")
    progress.say(f"  {'engine (continuous batching)':70s}: {useful / e_med:8.0f} tokens/s  ({fmt(e_ts)})")
    same = all(np.array_equal(a, b) for a, b in zip(o_out, e_out))
    progress.say(f"  engine / lockstep: {o_med / e_med:.2f}x   (samples identical: {same})")


def multi_turn(c, params, args):
    n, G, T = args.episodes, args.group, args.turns
    sc = sampler.sampler_config(c, stop_tokens=())

    def episodes(r):
        rng = np.random.default_rng(1000 + r)
        base = prompts(rng, n // G, 64, 128)
        obs = [[rng.integers(0, 256, size=args.obs).astype(np.int32) for _ in range(T + 1)] for _ in range(n)]
        summ = [rng.integers(0, 256, size=SUMMARY_LEN).astype(np.int32) for _ in range(n)]
        return [base[i // G] for i in range(n)], obs, summ

    def contexts_after(ctx, gen, obs, turn, prompt, summ):
        if turn == T - 1:            # the rewrite: prompt + summary (self-summarization's new context)
            return np.concatenate([prompt, summ])
        return np.concatenate([ctx, gen, obs])

    def old(data):
        base, obs, summ = data
        ctx, pre = list(base), 0
        for t in range(T + 1):
            g = sampler.generate(params, ctx, jax.random.key(t), cfg=c, max_new_tokens=args.new, sampling=sc)
            pre += sum(len(x) for x in ctx)
            if t < T:
                ctx = [contexts_after(ctx[i], g.tokens[i], obs[i][t], t, base[i], summ[i]) for i in range(n)]
        return pre

    def new(eng):
        def run(data):
            base, obs, summ = data
            ctx = list(base)
            before = eng.stats["prefill_tokens"]
            for t in range(T + 1):
                keys = request_keys(jax.random.key(t), n)
                out = E.generate_requests(eng, [E.Request(x, keys[i], args.new, owner=i) for i, x in enumerate(ctx)])
                if t < T:
                    ctx = [contexts_after(ctx[i], out[i].tokens, obs[i][t], t, base[i], summ[i]) for i in range(n)]
            for i in range(n):
                eng.release(i)
            return eng.stats["prefill_tokens"] - before
        return run

    engines = [("engine (cache across turns + groups)", E.Engine(c, params=params, stop_tokens=()))]
    if args.replicas > 1:      # routing by owner and by identical context must keep the reuse: same prefill tokens
        engines.append((f"engine, {args.replicas} replicas", R.make_engine(c, params=params, stop_tokens=(),
                                                                            replicas=args.replicas)))

    progress.say(f"\n[multi-turn] {n} episodes (groups of {G} share a prompt of 64-128 tokens), "
                 f"{T} turns of {args.new} tokens + {args.obs}-token observations, "
                 f"a rewrite to prompt + {SUMMARY_LEN}-token summary, one more turn")
    o_med, o_ts, o_pre = timed(old, episodes, args.warmup, args.reps)
    gen = n * (T + 1) * args.new
    progress.say(f"  {'lockstep generate (make run rl.sampler)':40s}: wall {o_med:6.2f} s  prefill {o_pre:7d} tokens  "
                 f"generated {gen}  ({fmt(o_ts)})")
    for name, eng in engines:
        e_med, e_ts, e_pre = timed(new(eng), episodes, args.warmup, args.reps)
        progress.say(f"  {name:40s}: wall {e_med:6.2f} s  prefill {e_pre:7d} tokens  generated {gen}  ({fmt(e_ts)})")
        progress.say(f"  {name} / lockstep: wall {o_med / e_med:.2f}x lower, "
                     f"prefill {o_pre / max(e_pre, 1):.2f}x fewer tokens")


def agent(c0, params, args):
    """Key-recall episodes (configs/selfsum_tiny.py's family and agent) through `run_episodes`, lockstep
    (one `sampler.generate` call per round) vs independent (`policy.EnginePolicy`), per context strategy. The weights
    are untrained (`--agent-params` is not loaded here): turns are malformed calls answered by the
    parse-error observation, so each episode runs `--agent-turns` turns and, past the trigger, the
    strategy's rewrite; what is measured is the loop: rollout wall time, prefill tokens, generated tokens."""
    from horizon.agent import Generation, run_episodes
    from horizon.data.tokenizer import tokenizer_from_config
    from horizon.env.families import family_from_config, make_episode
    from horizon.sandbox.factory import open_sandbox

    c = load_config_file(os.path.join(ROOT, "configs", "selfsum_tiny.py"))
    c.agent.max_malformed_calls = args.agent_turns
    c.agent.max_turns = args.agent_turns
    tok = tokenizer_from_config(c)
    params = numpy_init(ml_collections.FrozenConfigDict(c.model), 0)
    fam = family_from_config(c.exp)
    n = args.episodes
    tasks = fam.tasks("train", n)
    boxes = [open_sandbox(args.backend, c.exp.sandbox_image) if args.backend == "docker" else open_sandbox("local")
             for _ in range(n)]
    progress.say(f"\n[agent] {n} key-recall episodes ({args.backend} sandboxes, "
                 f"untrained weights: {args.agent_turns} malformed turns each unless the context fills), "
                 f"{c.agent.num_tool_workers} tool workers")
    try:
        for strategy in args.strategies:
            a = ml_collections.ConfigDict(c.agent.to_dict())
            a.context_strategy = strategy

            def run(policy, a=a):
                for sb, t in zip(boxes, tasks):
                    fam.reset(sb, t)
                eps = [make_episode(fam, t, sb, tok, a) for t, sb in zip(tasks, boxes)]
                t0 = time.perf_counter()
                trajs = run_episodes(policy, eps, num_tool_workers=int(a.num_tool_workers))
                return time.perf_counter() - t0, trajs

            holder = sampler.ParamsHolder(params)
            counted = {"prefill": 0, "key": jax.random.key(0)}
            sc = sampler.sampler_config(c)

            def old(contexts, max_new, counted=counted, sc=sc):  # the retired lockstep policy: one `generate` per round
                counted["prefill"] += sum(len(x) for x in contexts)
                counted["key"], sub = jax.random.split(counted["key"])
                out = sampler.generate(params, contexts, sub, cfg=c, max_new_tokens=max_new, sampling=sc)
                return [Generation(tokens=t, logprobs=lp, router_indices=ri, policy_version=0)
                        for t, lp, ri in zip(out.tokens, out.logprobs, out.router_indices)]

            new = engine_policy.EnginePolicy(holder, c, jax.random.key(0))
            rows = []
            for name, pol, pre in (("lockstep (generate)", old, lambda counted=counted: counted["prefill"]),
                                   ("engine (EnginePolicy)", new, lambda new=new: new.state["prefill_tokens"])):
                for _ in range(args.warmup):
                    run(pol)
                p0 = pre()
                dt, trajs = run(pol)
                gen = sum(t.num_generated_tokens for t in trajs)
                turns = sum(t.stats["turns"] + t.stats["summaries"] for t in trajs)
                rows.append((dt, pre() - p0))
                progress.say(f"  {strategy:17s} {name:24s}: wall {dt:6.2f} s  prefill {pre() - p0:7d} tokens  "
                             f"generated {gen:6d}  turns {turns}")
            (od, op), (nd, np_) = rows
            progress.say(f"  {strategy:17s} engine / lockstep: wall {od / nd:.2f}x lower, "
                         f"prefill {op / max(np_, 1):.2f}x fewer")
    finally:
        for sb in boxes:
            sb.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--stream", type=int, default=128)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--obs", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", nargs="+", default=["raw", "staggered", "multi_turn", "agent"])
    ap.add_argument("--backend", default="local", choices=("local", "docker"), help="agent workload sandboxes")
    ap.add_argument("--strategies", nargs="+", default=["self_summary", "sliding_window"])
    ap.add_argument("--agent-turns", type=int, default=4)
    ap.add_argument("--skip-hf", action="store_true", help="no Hugging Face generate column in the raw workload")
    ap.add_argument("--baseline-tree", default="", help="raw workload: also time this checkout's generate (the old "
                    "path, e.g. `git worktree add /tmp/pre24 e23df6f^`; benchmarks/generate_at_tree.py)")
    ap.add_argument("--replicas", type=int, default=2, help="raw / multi-turn: also time the engine with this many "
                    "data-parallel replicas (rl.sampler.engine_replicas; the process gets as many CPU devices); 1: not")
    args = ap.parse_args(argv)
    if min(args.batch, args.new, args.stream, args.episodes, args.group, args.turns, args.reps, args.warmup) < 1:
        ap.error("sizes, --reps and --warmup must be >= 1 (the warm-up absorbs compilation)")
    if args.replicas < 1 or args.batch % args.replicas:
        ap.error("--replicas must be >= 1 and divide --batch (each replica gets batch / replicas slots)")
    provenance.announce(config=vars(args))
    if args.replicas > 1 and {"raw", "multi_turn"} & set(args.only):
        jax.config.update("jax_num_cpu_devices", args.replicas)     # before JAX's CPU backend starts
    c = config()
    params = numpy_init(ml_collections.FrozenConfigDict(c.model), 0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPU cores")
    for name in progress.progress(args.only, desc="workloads", unit="workload"):
        {"raw": raw, "staggered": staggered, "multi_turn": multi_turn, "agent": agent}[name](c, params, args)


if __name__ == "__main__":
    main()
