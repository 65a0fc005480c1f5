"""SFT warm start + RL over agent rollouts in Docker sandboxes, on CPU (SPEC §4, §6, §7).

    python experiments/rl.py --config=configs/rl_tiny.py            # the demo (`make run`)
    python experiments/rl.py --config=configs/rl_tiny.py --set exp.steps=2 --set exp.sft.steps=5

Environment. A byte-level tiny model cannot solve the hand-written task set, so the demo
trains on a procedurally generated family (`horizon.tasks.synthetic`): "In settings.py set
TIMEOUT to 17." (the file has TIMEOUT = 42 among 2-4 constants) solved by ONE call of the env's compact tool
`<function=set><parameter=value>17</parameter><parameter=name>TIMEOUT</parameter></function>`
(SPEC §5 per-environment tool sets: executed for real in the sandbox, one exec), whose two
arguments are copied from the prompt; a fast `python3 -B -c` check is the verifier. Held-out
tasks are unseen seeds of the same family. The env has its own short system prompt
(`synthetic.SYSTEM_PROMPT`), so a context is ~95 bytes and the call ~100. (The previous
`edit_file` str_replace variant needed a ~200-byte call with four copied fields; after 120 SFT
steps the tiny model emitted no well-formed call at all, so RL had no signal.)

Pipeline.
1. SFT: scripted solutions rendered in the exact agent prompt format
   (`horizon.agent.prompt.render`), loss on assistant tokens only (`horizon.train.lm.train_step`).
   A fraction `exp.sft.corrupt_prob` of demos carries a wrong value, so the SFT policy
   emits well-formed calls but copies digits unreliably: RL has headroom. After SFT a
   sandbox-free check (`sft_check`: greedy and sampled decodes of the held-out prompts,
   parsed) logs the fraction of well-formed calls, the gate for RL to have any signal.
2. RL: each step takes `prompts_per_step` unseen train prompts (single epoch,
   `horizon.rl.prompts.PromptSampler`), `group_size` rollouts each, batched generation through
   `horizon.rl.sampler.make_policy`, tool calls and verification in a pool of reused Docker
   sandboxes (one exec resets a sandbox: `synthetic.reset_sandbox`), reward =
   `rewards.total_reward` (verifier + length penalty), then `build_batch` -> `train_step`
   (Dr.GRPO, KL k1 in the reward, router replay). Shapes are bucketed to one compile.
3. Eval: at step 0, every `exp.eval.every` steps and at the end, `exp.eval.passes` independent
   sampled passes over `exp.eval.n_tasks` held-out tasks; the std over passes is the eval noise;
   best-of-K on held-out = fraction of tasks solved by any of the passes (K = passes).

Outputs in `exp.out_dir` (or --out): config.json, metrics.jsonl (one record per SFT log / RL step /
eval, `phase` field), orbax checkpoints (sft/ and ckpt/ = RLState + prompt-sampler state; a rerun
resumes from the latest), rewards.png (mean and best-of-K vs step, train and held-out) and
summary.json (the must-show numbers).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from horizon.agent import Episode, Message, Segment, render, run_episodes
from horizon.agent.prompt import task_text
from horizon.data.tokenizer import ByteTokenizer
from horizon.model import transformer
from horizon.rl import batch as rlbatch
from horizon.rl import prompts, rewards, sampler, trainer
from horizon.tasks import verify
from horizon.tasks import synthetic
from horizon.tools.format import parse_action, render_call
from horizon.train import lm
from horizon.train.checkpoint import Checkpointer
from horizon.utils.config import apply_overrides, dump_config, load_config_file


# ----------------------------------------------------------------------------- config
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/rl_tiny.py")
    p.add_argument("--out", default=None, help="run directory (default c.exp.out_dir)")
    p.add_argument("--set", action="append", default=[], metavar="a.b=VALUE",
                   help="override a config field (JSON if parseable), e.g. --set exp.steps=2")
    return p.parse_args(argv)


def _merge(dst: ml_collections.ConfigDict, src: ml_collections.ConfigDict):
    for k, v in src.items():
        if isinstance(v, ml_collections.ConfigDict) and k in dst and isinstance(dst[k], ml_collections.ConfigDict):
            _merge(dst[k], v)
        else:
            dst[k] = v


def load(path: str, sets=()) -> ml_collections.ConfigDict:
    """The config with `--set`s applied, the agent section added and the `exp` overrides merged."""
    c = load_config_file(path)
    apply_overrides(c, sets)
    if "exp" not in c:
        raise ValueError(f"{path} has no `exp` section (see configs/rl_tiny.py's experiment block)")
    if "agent" not in c:
        c.agent = load_config_file(pathlib.Path(path).with_name("agent_tiny.py")).agent
    _merge(c.model, c.exp.model)
    _merge(c.agent, c.exp.agent)
    _merge(c.rl, c.exp.rl)
    c.rl.optim.steps = int(c.exp.steps)
    c.rl.optim.warmup_steps = min(int(c.rl.optim.warmup_steps), int(c.exp.steps) - 1)
    if c.exp.env != "synthetic":
        raise ValueError(f"exp.env {c.exp.env!r} not supported (only 'synthetic')")
    if c.exp.pool_size < c.rl.group_size * c.rl.prompts_per_step:
        raise ValueError("exp.pool_size must hold one step's rollouts (group_size * prompts_per_step)")
    if c.agent.max_context_tokens > c.model.max_seq_len:
        raise ValueError("agent.max_context_tokens must fit model.max_seq_len")
    return c


def make_task(seed: int, c) -> synthetic.Task:
    return synthetic.make_synthetic_task(seed, value_range=tuple(c.exp.value_range))


# ----------------------------------------------------------------------------- SFT
def demo_rows(tasks, c, tok, rng: np.random.Generator):
    """Token rows + loss masks of scripted solutions in the agent prompt format (loss on the call).

    A fraction `exp.sft.corrupt_prob` of demos carries a wrong (random, in range) value; the
    call around it is the exact canonical format, so corruption only blurs the digit copy."""
    S = int(c.exp.sft.seq_len)
    lo, hi = c.exp.value_range
    toks = np.full((len(tasks), S), tok.PAD, np.int32)
    mask = np.zeros((len(tasks), S), np.float32)
    for i, t in enumerate(tasks):
        call = dict(t.solution[0])
        args = dict(call["args"])
        if rng.random() < float(c.exp.sft.corrupt_prob):   # a wrong value: imperfect demonstrations
            args["value"] = str(int(rng.integers(lo, hi + 1)))
        ids = tok.encode(render_call(call["name"], args)) + [tok.END_TURN]
        msgs = [Message("system", synthetic.SYSTEM_PROMPT, kind="system"), Message("user", task_text(t), kind="task"),
                Message("assistant", tokens=np.asarray(ids, np.int32))]
        r = render(msgs, tok)
        if len(r.tokens) > S:
            raise ValueError(f"demo of {t.id} has {len(r.tokens)} tokens > exp.sft.seq_len={S}")
        toks[i, :len(r.tokens)] = r.tokens
        mask[i, :len(r.tokens)] = r.loss_mask
    return toks, mask


def run_sft(params, c, tok, out, log):
    """Train `params` on demonstrations (resumes from out/sft if present). Returns params."""
    sc = ml_collections.ConfigDict(dict(model=c.model, train=c.exp.sft.optim))
    sc.train.steps = int(c.exp.sft.steps)
    sc.train.warmup_steps = min(int(sc.train.warmup_steps), int(c.exp.sft.steps) - 1)
    opt = lm.optimizer(params, sc)
    state = lm.TrainState(jnp.zeros((), jnp.int32), params, opt.init(params), jax.random.PRNGKey(0))
    ck = Checkpointer(out / "sft", every=max(1, int(c.exp.sft.steps)), keep=1)
    got = ck.restore_latest(state)
    if got is not None:
        ck.close()
        print(f"SFT: restored step {got[1]['step']} from {out / 'sft'}")
        return got[0].params
    rng = np.random.default_rng(int(c.seed))
    tasks = [make_task(s, c) for s in synthetic.synthetic_seeds("train", int(c.exp.n_sft_tasks))]
    toks, mask = demo_rows(tasks, c, tok, rng)
    S, B = toks.shape[1], int(c.exp.sft.batch_size)
    step_fn = lm.jit_train_step(sc)
    pos = np.broadcast_to(np.arange(S, dtype=np.int32), (B, S))
    t0 = time.time()
    for i in range(int(c.exp.sft.steps)):
        idx = rng.choice(len(tasks), B, replace=False)
        b = dict(tokens=toks[idx], segment_ids=(toks[idx] != tok.PAD).astype(np.int32), positions=pos, mask=mask[idx])
        state, m = step_fn(state, {k: jnp.asarray(v) for k, v in b.items()})
        if (i + 1) % int(c.exp.sft.log_every) == 0 or i + 1 == int(c.exp.sft.steps):
            rec = dict(phase="sft", step=i + 1, loss=float(m["loss"]), wall_s=time.time() - t0)
            log(rec)
            print(f"sft {i + 1}/{c.exp.sft.steps}: loss {rec['loss']:.4f} ({rec['wall_s']:.0f}s)", flush=True)
    ck.save(int(c.exp.sft.steps), state, {"step": int(c.exp.sft.steps)}, force=True)
    ck.close()
    return state.params


def sft_check(params, tasks, c, tok, key) -> dict:
    """Greedy and sampled decodes on held-out prompts, parsed without a sandbox: the fraction of
    well-formed `set` calls and of exactly right arguments (the SFT gate; no tool execution)."""
    ctx = [render([Message("system", synthetic.SYSTEM_PROMPT, kind="system"), Message("user", task_text(t))], tok,
                  add_generation_prompt=True).tokens for t in tasks]
    out = {}
    for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
        kw = dict(sampler.sampler_kwargs_from_config(c), temperature=temp)
        n = int(c.exp.pool_size)             # chunks shaped like the rollout batches: no extra compile
        gen = [g for i in range(0, len(ctx), n) for g in sampler.generate(
            params, ctx[i:i + n], jax.random.fold_in(key, i), cfg=c, max_new_tokens=int(c.agent.max_new_tokens),
            **kw).tokens]
        acts = [parse_action(tok.decode(g)) for g in gen]
        ok = [getattr(a, "kind", "") == "call" and a.name == t.solution[0]["name"] for a, t in zip(acts, tasks)]
        out[f"{name}_wellformed"] = float(np.mean(ok))
        out[f"{name}_correct"] = float(np.mean([o and a.args == t.solution[0]["args"]
                                                for o, a, t in zip(ok, acts, tasks)]))
        out[f"{name}_example"] = tok.decode(gen[0])
    return out


# ----------------------------------------------------------------------------- rollouts
class SandboxPool:
    """`n` sandboxes created in parallel and reused across episodes (reset by one exec each)."""

    def __init__(self, n: int, c):
        from horizon.sandbox import open_sandbox

        limits = dict(cpus=float(c.exp.sandbox_cpus), mem_limit=str(c.exp.sandbox_mem)) \
            if c.exp.backend == "docker" else {}
        self.workers = int(c.agent.num_tool_workers)
        image = None if c.exp.backend != "docker" else "horizon-sandbox:base"
        if c.exp.backend == "docker":  # sandboxes are made in worker threads: install SIGTERM cleanup here
            from horizon.sandbox.docker import install_cleanup_hooks

            install_cleanup_hooks()
        with ThreadPoolExecutor(self.workers) as ex:
            self.boxes = list(ex.map(lambda _: open_sandbox(c.exp.backend, image, **limits), range(n)))

    def map(self, fn, *its):
        with ThreadPoolExecutor(self.workers) as ex:
            return list(ex.map(fn, *its))

    def close(self):
        self.map(lambda b: b.close(), self.boxes)


def trim_segment(seg: Segment) -> Segment:
    """Drop tokens after the last model token (the final observation): they carry no loss and,
    the model being causal, do not change any trained log-prob; keeps rows in one length bucket."""
    hit = np.nonzero(np.asarray(seg.loss_mask))[0]
    n = int(hit[-1]) + 1 if len(hit) else len(seg.tokens)
    ri = None if seg.router_indices is None else seg.router_indices[:, :n]
    return Segment(seg.tokens[:n], seg.loss_mask[:n], seg.logprobs[:n], seg.policy_versions[:n], ri)


def rollout_batch(tasks, policy, pool: SandboxPool, c, tok):
    """One episode per task (len(tasks) <= pool size) -> (trajectories, rewards, infos)."""
    boxes = pool.boxes[:len(tasks)]
    pool.map(synthetic.reset_sandbox, boxes, tasks)
    reg = synthetic.synthetic_registry(strict=bool(c.agent.strict_tools))
    eps = []
    for t, sb in zip(tasks, boxes):
        ep = Episode(t, sb, reg, tok, c.agent)
        ep.messages[0] = Message("system", synthetic.SYSTEM_PROMPT, kind="system")   # the env's short prompt
        eps.append(ep)
    steps = 2 * (int(c.agent.max_turns) + int(c.agent.max_malformed_calls)) + 2
    trajs = run_episodes(policy, eps, max_steps=steps, num_tool_workers=pool.workers)
    for tr in trajs:
        tr.segments = [trim_segment(sg) for sg in tr.segments]
    vs = pool.map(lambda t, sb, tr: verify(t, sb, tr.final_answer, timeout=float(c.exp.verify_timeout_s)),
                  tasks, boxes, trajs)
    rs, infos = [], []
    for tr, v in zip(trajs, vs):
        r, info = rewards.total_reward(v.reward, tr.stats, c.rl)
        rs.append(float(r))
        infos.append(dict(info, verifier=v.reward, end=tr.end_reason, **tr.stats))
    return trajs, rs, infos


def evaluate(params, tasks, pool, c, tok, key, version):
    """`passes` sampled passes over held-out tasks: mean, std over passes, best-of-passes, per-pass."""
    holder = sampler.ParamsHolder(params, version=version)
    policy = sampler.make_policy(holder, c, key, temperature=float(c.exp.eval.temperature))
    n = len(pool.boxes)
    solved = np.zeros((int(c.exp.eval.passes), len(tasks)), np.float32)
    for p in range(int(c.exp.eval.passes)):
        for i in range(0, len(tasks), n):
            chunk = tasks[i:i + n]
            _, _, infos = rollout_batch(chunk, policy, pool, c, tok)
            solved[p, i:i + len(chunk)] = [inf["verifier"] for inf in infos]
    per_pass = solved.mean(axis=1)
    return dict(heldout_mean=float(per_pass.mean()), heldout_std=float(per_pass.std(ddof=1)) if len(per_pass) > 1
                else 0.0, heldout_best_of_k=float(solved.max(axis=0).mean()), heldout_passes=per_pass.tolist())


# ----------------------------------------------------------------------------- plot
def plot(records, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = [r for r in records if r.get("phase") == "rl"]
    ev = [r for r in records if r.get("phase") == "eval"]
    fig, ax = plt.subplots(figsize=(6, 4))
    if rl:
        s = [r["step"] for r in rl]
        ax.plot(s, [r["reward_mean"] for r in rl], ".-", alpha=0.5, label="train reward (mean)")
        ax.plot(s, [r["best_of_k"] for r in rl], ".-", alpha=0.5, label=f"train best-of-{rl[0]['group_size']}")
    if ev:
        s = [r["step"] for r in ev]
        ax.errorbar(s, [r["heldout_mean"] for r in ev], yerr=[r["heldout_std"] for r in ev], fmt="o-", capsize=3,
                    label="held-out success (mean ± std over passes)")
        ax.plot(s, [r["heldout_best_of_k"] for r in ev], "s--", label=f"held-out best-of-{len(ev[0]['heldout_passes'])}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward / success")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("RL on synthetic config-edit tasks (Docker sandboxes, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def main(argv=None):
    a = parse_args(argv)
    t_start = time.time()
    c = load(a.config, a.set)
    out = pathlib.Path(a.out or c.exp.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(c, out / "config.json")
    if c.train.get("compilation_cache_dir"):
        jax.config.update("jax_compilation_cache_dir", str(c.train.compilation_cache_dir))
    tok = ByteTokenizer(c.model.vocab_size)
    records = []
    logf = open(out / "metrics.jsonl", "a")

    def log(rec):
        rec = dict(rec, time_s=time.time() - t_start)
        records.append(rec)
        logf.write(json.dumps(rec) + "\n")
        logf.flush()

    key = jax.random.key(int(c.seed))
    key, k_init, k_pol, k_eval = jax.random.split(key, 4)
    pool = SandboxPool(int(c.exp.pool_size), c)
    print(f"{len(pool.boxes)} {c.exp.backend} sandboxes ready ({time.time() - t_start:.0f}s)", flush=True)
    try:
        params = run_sft(transformer.init(k_init, c.model), c, tok, out, log)
        steps = int(c.exp.steps)
        G, P = int(c.rl.group_size), int(c.rl.prompts_per_step)
        rl_seeds = synthetic.synthetic_seeds("train", steps * P, start=int(c.exp.n_sft_tasks))
        tasks = {f"synth_{s}": make_task(s, c) for s in rl_seeds}
        heldout = [make_task(s, c) for s in synthetic.synthetic_seeds("heldout", int(c.exp.eval.n_tasks))]
        psamp = prompts.sampler_from_config(sorted(tasks), c.rl, seed=int(c.seed))
        if not (out / "ckpt").is_dir():
            t0 = time.time()
            chk = dict(sft_check(params, heldout, c, tok, jax.random.fold_in(k_eval, 10**6)), phase="sft_check")
            log(dict(chk, check_s=time.time() - t0))
            print(f"SFT check on {len(heldout)} held-out prompts: well-formed greedy {chk['greedy_wellformed']:.2f} "
                  f"sampled {chk['sampled_wellformed']:.2f}; correct greedy {chk['greedy_correct']:.2f} sampled "
                  f"{chk['sampled_correct']:.2f} (no sandbox); e.g. {chk['greedy_example']!r}", flush=True)
        state = trainer.init_state(params, c)
        ck = Checkpointer(out / "ckpt", every=max(1, int(c.train.checkpoint_every)), keep=int(c.train.max_checkpoints))
        start = 0
        got = ck.restore_latest(state)
        if got is not None:
            state, meta = got
            start = int(meta["step"])
            psamp = prompts.PromptSampler.from_state_dict(meta["prompt_sampler"])
            print(f"RL: resumed at step {start}")
        holder = sampler.ParamsHolder(state.params, version=start)
        policy = sampler.make_policy(holder, c, k_pol)
        evals = {}

        def do_eval(step):
            t0 = time.time()
            e = evaluate(state.params, heldout, pool, c, tok, jax.random.fold_in(k_eval, step), step)
            e.update(phase="eval", step=step, eval_s=time.time() - t0)
            log(e)
            evals[step] = e
            print(f"eval @ {step}: held-out {e['heldout_mean']:.3f} ± {e['heldout_std']:.3f} "
                  f"(passes {['%.3f' % x for x in e['heldout_passes']]}), best-of-{c.exp.eval.passes} "
                  f"{e['heldout_best_of_k']:.3f} ({e['eval_s']:.0f}s)", flush=True)

        if start == 0:
            do_eval(0)
        for step in range(start, steps):
            t0 = time.time()
            ids = psamp.sample(P, step)
            if len(ids) < P:
                print("prompt set exhausted (single epoch): stopping")
                break
            batch_tasks = [tasks[i] for i in ids for _ in range(G)]
            trajs, rs, infos = rollout_batch(batch_tasks, policy, pool, c, tok)
            for t, tr in zip(batch_tasks, trajs):
                psamp.record_rollout(t.id, turns=tr.stats["turns"], thinking_tokens=tr.stats["thinking_tokens"])
            t_roll = time.time() - t0
            groups = [trajs[g * G:(g + 1) * G] for g in range(P)]
            b = rlbatch.build_batch_from_config(groups, np.asarray(rs, np.float32).reshape(P, G), c)
            t1 = time.time()
            state, m = trainer.train_step(state, b, cfg=c)
            holder.update(state.params, version=step + 1)
            rec = {k: float(v) for k, v in jax.device_get(m).items()}
            gen = sum(tr.num_generated_tokens for tr in trajs)
            rec.update(phase="rl", step=step + 1, group_size=G, rollout_s=t_roll, train_s=time.time() - t1,
                       step_s=time.time() - t0, gen_tokens_per_s=gen / max(t_roll, 1e-9),
                       success=float(np.mean([i["verifier"] for i in infos])),
                       malformed=float(np.mean([i["malformed_calls"] > 0 for i in infos])),
                       **{f"batch/{k}": v for k, v in rlbatch.batch_stats(b).items()})
            log(rec)
            print(f"step {step + 1}/{steps}: reward {rec['reward_mean']:.3f} best-of-{G} {rec['best_of_k']:.3f} "
                  f"success {rec['success']:.3f} malformed {rec['malformed']:.2f} kl {rec.get('kl_k1', 0.0):.2e} "
                  f"gen {rec['gen_tokens_per_s']:.0f} tok/s rollout {t_roll:.1f}s train {rec['train_s']:.1f}s "
                  f"wall {time.time() - t_start:.0f}s", flush=True)
            ck.save(step + 1, state, {"step": step + 1, "prompt_sampler": psamp.state_dict()}, force=step + 1 == steps)
            every = int(c.exp.eval.every)
            if step + 1 < steps and every > 0 and (step + 1) % every == 0:
                do_eval(step + 1)
        final = int(jax.device_get(state.step))
        if final not in evals:
            do_eval(final)
        ck.close()
    finally:
        pool.close()
    first, last = evals[min(evals)], evals[max(evals)]
    noise = max(first["heldout_std"], last["heldout_std"])
    rl_recs = [r for r in records if r.get("phase") == "rl"]
    summary = dict(
        heldout_start=first["heldout_mean"], heldout_end=last["heldout_mean"],
        heldout_gain=last["heldout_mean"] - first["heldout_mean"], eval_noise_std=noise,
        gain_over_3std=bool(last["heldout_mean"] - first["heldout_mean"] > 3 * noise),
        heldout_best_of_k_start=first["heldout_best_of_k"], heldout_best_of_k_end=last["heldout_best_of_k"],
        train_best_of_k_first=rl_recs[0]["best_of_k"] if rl_recs else None,
        train_best_of_k_last=rl_recs[-1]["best_of_k"] if rl_recs else None,
        wall_s=time.time() - t_start, steps=final)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print("summary:", json.dumps(summary))
    if c.exp.plot:
        plot(records, out / "rewards.png")
    logf.close()
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
