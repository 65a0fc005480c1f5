"""The self-summarization study's pieces (SPEC §6; experiments/selfsum.py): demonstration chains per
context strategy, the stage-1 curriculum, the teacher-forced key-copy check after SFT, and the
result table and figure."""

from __future__ import annotations

import copy
import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from horizon.env.demos import key_recall_demos
from horizon.env.families import family_from_config
from horizon.model import transformer
from horizon.tasks import key_recall
from horizon.utils.config import deep_merge


def with_strategy(c, strategy: str):
    """A copy of `c` whose agent runs `strategy`."""
    cs = copy.deepcopy(c)
    cs.agent.context_strategy = strategy
    return cs


def demo_rows(family, c, tok, strategies, corrupt_prob: float, tasks=None):
    """Demo segments for each of `strategies` on `tasks` (default: train seeds [0, n_sft_tasks),
    the same tasks for each strategy)."""
    from horizon.sandbox import open_sandbox

    tasks = family.tasks("train", int(c.exp.n_sft_tasks)) if tasks is None else tasks
    boxes = [open_sandbox(c.exp.demo_backend, c.exp.sandbox_image if c.exp.demo_backend == "docker" else None)
             for _ in range(int(c.exp.demo_sandboxes))]
    try:
        rows = []
        for s in strategies:
            t0 = time.time()
            got = key_recall_demos(family, tasks, tok, with_strategy(c, s).agent, boxes, corrupt_prob=corrupt_prob,
                                   seed=int(c.seed), key_alphabet=str(c.exp.task.key_alphabet))
            print(f"demos {s} (lossy summaries {corrupt_prob:.2f}): {len(tasks)} chains -> {len(got)} segments "
                  f"({time.time() - t0:.0f}s)", flush=True)
            rows += got
        return rows
    finally:
        for b in boxes:
            b.close()


def stage1_configs(c) -> list:
    """One config per entry of `exp.sft.clean_mix`, the stage-1 curriculum (name -> overrides:
    ConfigDicts iterate in name order, and a tuple of dicts would not survive the trainer's
    FrozenConfigDict): each entry's `task` overrides merged over `exp.task` and its `agent`
    overrides over the agent section (an empty entry is the experiment's own chains). The mix
    spreads the distance from key.txt's observation to the summary, so that the lookup cannot
    key on the offset: learned on short chains only, the copy did not carry over to the full
    ones (docs/PERF.md)."""
    mixes = c.exp.sft.get("clean_mix") or ml_collections.ConfigDict(dict(full={}))
    if not isinstance(mixes, ml_collections.ConfigDict):
        raise ValueError(f"exp.sft.clean_mix must map names to {{task, agent}} overrides, got {type(mixes).__name__}")
    out = []
    for name, mix in mixes.items():
        unknown = set(mix.keys()) - {"task", "agent"}
        if unknown:
            raise ValueError(f"exp.sft.clean_mix.{name} has unknown keys {sorted(unknown)} (allowed: task, agent)")
        cs = copy.deepcopy(c)
        deep_merge(cs.exp.task, mix.get("task", {}))
        deep_merge(cs.agent, mix.get("agent", {}))
        out.append(cs)
    return out


def warm_start_demos(family, c, tok):
    """`loop.two_stage_sft`'s demos: stage 1 clean chains of `exp.sft.clean_strategies` on each
    of the stage-1 task sizes (`stage1_configs`), stage 2 all of `exp.strategies` on the
    experiment's tasks with `exp.sft.corrupt_prob` lossy summaries."""
    def demos(clean: bool):
        if clean:
            return [r for cs in stage1_configs(c) for r in
                    demo_rows(family_from_config(cs.exp), cs, tok, tuple(c.exp.sft.clean_strategies), 0.0)]
        return demo_rows(family, c, tok, tuple(c.exp.strategies), float(c.exp.sft.corrupt_prob))
    return demos


@functools.partial(jax.jit, static_argnames=("cfg",))
def _logits(params, tokens, *, cfg):
    return transformer.forward(params, tokens, cfg=cfg)[0]


def key_copy_check(params, family, c, tok) -> dict:
    """The SFT gate, without sampling or sandboxes: on clean demo chains of `exp.check_tasks`
    held-out tasks, the teacher-forced accuracy of the key's letter where the demonstrator writes
    them — in a summary (copied from key.txt's observation) and in the final answer (copied from
    the summary or the observation). Chance is 1/23 (~0.04); a policy that carries the key
    through a summary needs both near 1. Sliding-window finals are guesses and not scored."""
    tasks = family.tasks("heldout", int(c.exp.check_tasks))
    model_cfg = ml_collections.FrozenConfigDict(c.model)             # hashable: one compile per shape per run
    out = {}
    for s in c.exp.strategies:
        hits = {"summary": [], "final": []}
        for tokens, mask in demo_rows(family, c, tok, (s,), 0.0, tasks=tasks):
            text = tok.decode(tokens)
            m = key_recall.KEY_RE.search(text)
            if m is None:                                 # the window dropped the key: the answer is a guess
                continue
            pat = tok.encode(key_recall.KEY_MARK + m.group(1))
            n = len(tokens)
            padded = np.pad(np.asarray(tokens, np.int32), (0, -n % 128))[None]     # few shapes: few compiles
            pred = np.asarray(jnp.argmax(_logits(params, jnp.asarray(padded), cfg=model_cfg), -1))[0]
            for i in range(n - len(pat) + 1):
                if mask[i] and all(tokens[i + j] == pat[j] for j in range(len(pat))):
                    before = tok.decode(tokens[:i])
                    kind = "summary" if before.rfind("<summary>") > before.rfind("</summary>") else "final"
                    hits[kind] += [bool(pred[i + j - 1] == tokens[i + j]) for j in range(1, len(pat))]
        for kind, h in hits.items():
            if h:
                out[f"{s}_{kind}_key_acc"] = float(np.mean(h))
    return out


def copy_probe(family, c, tok):
    """The SFT probe (`loop.two_stage_sft`'s `probe`, every `exp.sft.probe_every` steps):
    `key_copy_check` of the stage-1 strategies on `exp.sft.probe_tasks` held-out chains of the
    experiment's own tasks, so the log shows when the copy forms (docs/PERF.md)."""
    cs = copy.deepcopy(c)
    cs.exp.check_tasks = int(c.exp.sft.get("probe_tasks", c.exp.check_tasks))
    cs.exp.strategies = tuple(c.exp.sft.clean_strategies)
    return lambda params: key_copy_check(params, family, cs, tok)


def table(results: dict, passes: int) -> str:
    """The markdown table of the study: held-out success before/after RL and the summary costs per strategy."""
    head = ("| strategy | success, SFT policy | success, after RL | best-of-" + str(passes) +
            " after RL | generated tokens per solved task | summaries per episode | tokens per summary |\n"
            "|---|---|---|---|---|---|---|\n")

    def f(x, fmt="{:.3f}"):
        return "n/a" if x is None else fmt.format(x)

    rows = []
    for s, r in results.items():
        a, b = r["start"], r["end"]
        rows.append(f"| {s} | {f(a['heldout_mean'])} ± {f(a['heldout_std'])} | {f(b['heldout_mean'])} ± "
                    f"{f(b['heldout_std'])} | {f(b['heldout_best_of_k'])} | {f(b['eval_tokens_per_solved'], '{:.0f}')} "
                    f"| {f(b['eval_summaries'], '{:.2f}')} | {f(b['eval_tokens_per_summary'], '{:.0f}')} |")
    return head + "\n".join(rows) + "\n"


def plot(results: dict, path) -> None:
    """selfsum.png: success per strategy (SFT policy vs after RL) and tokens per summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(results)
    x = np.arange(len(names))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for off, when, lab in ((-0.2, "start", "SFT policy"), (0.2, "end", "after RL")):
        a1.bar(x + off, [results[n][when]["heldout_mean"] for n in names], 0.4,
               yerr=[results[n][when]["heldout_std"] for n in names], capsize=3, label=lab)
    a1.set_xticks(x, names)
    a1.set_ylabel("held-out success")
    a1.set_ylim(0, 1.05)
    a1.legend()
    a1.set_title("key recall across compactions")
    a2.bar(x, [results[n]["end"]["eval_tokens_per_summary"] or 0 for n in names], 0.5)
    a2.set_xticks(x, names)
    a2.set_ylabel("tokens per summary (after RL)")
    a2.set_title("summary cost")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
