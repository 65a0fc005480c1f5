"""Short SFT on scripted demonstrations of the synthetic task family (SPEC §7 "trained" checkpoint).

Rolls out the scripted solution (`horizon.agent.ScriptedPolicy`) through the real agent loop on
`c.sft.num_demos` TRAIN seeds of `horizon.tasks.synthetic` (eval uses held-out seeds), checks the
first `c.sft.verify_demos` with the verifier (the rest end with a clean final answer), and trains the tiny model with next-token CE on the model tokens of
each episode (the agent's loss mask). Writes an orbax checkpoint of the lm `TrainState` to
`<c.sft.output_dir>/checkpoints`, `metrics.jsonl` and `loss_curve.png`.

    python experiments/sft_synthetic.py --config=configs/eval_tiny.py [--steps=N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from horizon.agent import ScriptedPolicy, run_episodes  # noqa: E402
from horizon.eval.harness import EvalSetup, make_episode  # noqa: E402
from horizon.data.tokenizer import ByteTokenizer  # noqa: E402
from horizon.eval.report import plot_jsonl  # noqa: E402
from horizon.tasks import open_task_sandbox, verify  # noqa: E402
from horizon.tasks.synthetic import SYSTEM_PROMPT, make_synthetic_task, synthetic_registry, synthetic_seeds  # noqa: E402
from horizon.train import checkpoint, lm  # noqa: E402
from horizon.utils.config import dump_config, load_config_file  # noqa: E402


def demo_rows(c, tok) -> dict[str, np.ndarray]:
    """Padded [n, seq_len] tokens / segment_ids / positions / mask of verified scripted episodes."""
    seeds = synthetic_seeds("train", int(c.sft.num_demos), int(c.sft.demo_seed_start))
    L = int(c.sft.seq_len)
    rows = []
    setup = EvalSetup(agent_cfg=c.agent, tokenizer=tok, registry_fn=lambda t: synthetic_registry(), num_passes=1,
                      system_prompt=SYSTEM_PROMPT if c.eval.system_prompt == "synthetic" else None)
    for i in range(0, len(seeds), 64):
        tasks = [make_synthetic_task(s) for s in seeds[i:i + 64]]
        boxes = [open_task_sandbox(t, backend=c.sft.demo_backend) for t in tasks]
        try:
            eps = [make_episode(t, sb, setup) for t, sb in zip(tasks, boxes)]
            trajs = run_episodes(ScriptedPolicy.from_tasks(tasks, tok), eps, max_steps=4 * int(c.agent.max_turns))
            for j, (t, sb, tr) in enumerate(zip(tasks, boxes, trajs)):
                if tr.stats["tool_calls"] < 1 or tr.stats["malformed_calls"]:
                    continue
                if i + j < int(c.sft.verify_demos) and verify(t, sb, tr.final_answer).reward < 1.0:
                    raise RuntimeError(f"scripted demo of {t.id} fails its verifier")
                for seg in tr.segments:
                    end = int(np.nonzero(seg.loss_mask)[0][-1]) + 1   # drop the trailing observation (no loss)
                    seg = dataclasses.replace(seg, tokens=seg.tokens[:end], loss_mask=seg.loss_mask[:end])
                    if len(seg.tokens) > L:
                        raise ValueError(f"demo of {t.id} has {len(seg.tokens)} tokens > sft.seq_len={L}")
                    rows.append((seg.tokens, seg.loss_mask))
        finally:
            for sb in boxes:
                sb.close()
    n = len(rows)
    out = dict(tokens=np.full((n, L), tok.PAD, np.int32), segment_ids=np.zeros((n, L), np.int32),
               positions=np.tile(np.arange(L, dtype=np.int32), (n, 1)), mask=np.zeros((n, L), np.float32))
    for j, (t, m) in enumerate(rows):
        out["tokens"][j, :len(t)] = t
        out["segment_ids"][j, :len(t)] = 1
        out["mask"][j, :len(t)] = m
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/eval_tiny.py")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    c = load_config_file(a.config)
    if a.steps is not None:
        c.train.steps = a.steps
    out = pathlib.Path(a.out or c.sft.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(c, out / "config.json")
    tok = ByteTokenizer(c.model.vocab_size)
    t0 = time.time()
    data = demo_rows(c, tok)
    n = len(data["tokens"])
    print(f"{n} demo rows in {time.time() - t0:.0f}s ({int(data['mask'].sum())} target tokens)", flush=True)
    state = lm.init_state(jax.random.PRNGKey(int(c.seed)), c)
    step_fn = jax.jit(lambda s, b: lm.train_step(s, b, cfg=c))
    rng = np.random.default_rng(int(c.seed))
    ckpt = checkpoint.Checkpointer(out / "checkpoints", every=int(c.train.checkpoint_every),
                                   keep=int(c.train.max_checkpoints))
    B = int(c.data.batch_size)
    metrics = out / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    for step in range(1, int(c.train.steps) + 1):
        idx = rng.choice(n, size=B, replace=n < B)
        state, m = step_fn(state, {k: v[idx] for k, v in data.items()})
        if step % int(c.train.log_every) == 0 or step == int(c.train.steps):
            rec = {"step": step, **{k: float(v) for k, v in jax.device_get(m).items()}, "wall_s": time.time() - t0}
            with metrics.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"step {step} loss {rec['loss']:.4f} ({rec['wall_s']:.0f}s)", flush=True)
        ckpt.save(step, state, {"data_step": step, "seed": int(c.seed), "source": "sft_synthetic"},
                  force=step == int(c.train.steps))
    ckpt.close()
    plot_jsonl(metrics, out / "loss_curve.png", x="step", y=["loss"])
    print(f"files: {out}/{{metrics.jsonl, loss_curve.png, config.json, checkpoints/}}")


if __name__ == "__main__":
    main()
