"""Where a policy's answers fail when its summaries are perfect: the oracle-summary policy, slot by slot.

    python benchmarks/selfsum_oracle.py --config=configs/selfsum_rl.py --config.seed=0
    python benchmarks/selfsum_oracle.py --config=configs/selfsum_rl.py --config.exp.eval.temperature=0.0

The SFT checkpoint the study left for `seed` (`<exp.out_dir>/seed<seed>/sft`, experiments/selfsum.py)
acts as the rollout engine at `exp.eval.temperature` on
`exp.eval.n_tasks` held-out tasks of the study's family in LocalSandboxes; every summary turn is the
demonstrator's perfect summary (`horizon.studies.oracle`). Prints each episode's expected and given
answer, then the share of episodes whose answer has the right letter in each slot (keys in order,
then the pin where the task needs it) and the share solved. Slots that fail with a perfect memory
are the policy's answer copy, not its summaries: RL on summaries cannot fix them (docs/RESULTS.md).
"""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np

from horizon.agent import run_episodes
from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.families import family_from_config, make_episode
from horizon.eval.harness import load_params
from horizon.inference import policy as engine_policy
from horizon.inference import sampler
from horizon.sandbox import open_sandbox
from horizon.studies import selfsum as ss
from horizon.studies.oracle import OracleSummaries
from horizon.utils import cli, provenance


def slot_hits(expected: str, given: str) -> list[bool]:
    """Per slot of `expected` ("#Q #Z #B"), whether `given` has the same letter in that slot."""
    e, g = expected.split(), given.split()
    return [i < len(g) and g[i] == x for i, x in enumerate(e)]


def main(argv=None):
    c = cli.load(argv, default="configs/selfsum_rl.py", validate=ss.validate_config, derive=ss.apply_quick,
                 doc=__doc__, prog="benchmarks/selfsum_oracle.py")
    provenance.announce(argv, config=c)
    tok = tokenizer_from_config(c)
    ckpt = pathlib.Path(c.exp.out_dir) / f"seed{c.seed}" / "sft"
    if not ckpt.is_dir():
        sys.exit(f"benchmarks/selfsum_oracle.py: no SFT checkpoint at {ckpt} (run experiments/selfsum.py first)")
    params, meta = load_params(str(ckpt), c)
    temp = float(c.exp.eval.temperature)
    fam = family_from_config(c.exp)
    tasks = fam.tasks("heldout", int(c.exp.eval.n_tasks))
    boxes = [open_sandbox("local", None) for _ in tasks]
    try:
        for t, b in zip(tasks, boxes):
            fam.reset(b, t)
        pol = engine_policy.rollout_policy(sampler.ParamsHolder(params, version=0), c, jax.random.PRNGKey(int(c.seed)),
                                           temperature=temp)
        eps = [make_episode(fam, t, b, tok, c.agent) for t, b in zip(tasks, boxes)]
        trs = run_episodes(OracleSummaries(pol, tok, seed=int(c.seed)), eps, num_tool_workers=8)
    finally:
        for b in boxes:
            b.close()
    hits = {}
    for t, tr in zip(tasks, trs):
        h = slot_hits(t.final_answer, tr.final_answer)
        print(f"{t.id}: expected {t.final_answer!r}, answered {tr.final_answer!r} ({tr.end_reason}, "
              f"{tr.stats['summaries']} summaries)")
        for i, x in enumerate(h):
            hits.setdefault("pin" if i == 3 else f"key {i + 1}", []).append(x)
    solved = np.mean([t.final_answer == tr.final_answer for t, tr in zip(tasks, trs)])
    print(f"{ckpt} (step {meta.get('step')}), temperature {temp}, {len(tasks)} tasks, perfect summaries: "
          + ", ".join(f"{k} right {np.mean(v):.2f}" for k, v in hits.items()) + f"; solved {solved:.3f}")


if __name__ == "__main__":
    main()
