"""Scoping run for the self-summarization study (docs/SPEC.md §6): when does the key copy form?

    python benchmarks/selfsum_scope.py --config=configs/selfsum_tiny.py --config.exp.seeds='(0, 1, 2)'

Per seed of `exp.seeds`: stage 1 of the study's SFT only (`warmstart.run_sft` on the same equal-share
correct demos of every strategy, `selfsum.warm_start_demos(...)(True)`, the stage-1 row shape,
lr and `exp.sft.remat`), with `selfsum.key_copy_check` on `exp.sft.probe_tasks` held-out chains
every `exp.sft.probe_every` steps. Prints one line per probe and, per seed, the first probed step
at which every summarizing strategy's key-in-summary reaches `exp.report.copy_threshold`, and the
seconds per SFT step. Checkpoints in exp.out_dir/scope/seed<k> (a rerun restores them).
"""

from __future__ import annotations

import copy
import pathlib
import sys
import time

from horizon.agent.summarize import SUMMARIZING
from horizon.model import transformer
from horizon.rl.runtime import loop, warmstart
from horizon.studies import selfsum as ss
from horizon.utils import cli, progress, provenance
from horizon.utils.seeds import run_keys


def scope_seed(c, family, tok, log) -> dict:
    """Stage 1 for `c.seed` with the probe; returns {probes: [(step, check)], formed_at, s_per_step}."""
    s = c.exp.sft
    out = pathlib.Path(c.exp.out_dir)
    history = []
    probe = ss.copy_probe(family, c, tok)
    thr = float(c.exp.report.copy_threshold)
    summ = [x for x in c.exp.strategies if x in SUMMARIZING]

    def probed(params):
        chk = probe(params)
        history.append(chk)
        mem = " ".join(f"{x}={chk.get(f'{x}_summary_key_acc', float('nan')):.2f}" for x in summ)
        ans = " ".join(f"{x}={chk.get(f'{x}_final_key_acc', float('nan')):.2f}" for x in c.exp.strategies)
        slots = " ".join(f"{k.removeprefix('self_summary_summary_key_acc_')}={v:.2f}" for k, v in chk.items()
                         if k.startswith("self_summary_summary_key_acc_m"))
        progress.say(f"seed {c.seed} probe {len(history)}: key in summary {mem} | answer {ans}"
                     + (f" | self-summary slots {slots}" if slots else ""))
        return chk

    t0 = time.time()
    warmstart.clean_sft(transformer.init(run_keys(c.seed)["init"], c.model),
                   lambda: ss.warm_start_demos(family, c, tok)(True), c, out, log, name="sft_clean", probe=probed)
    wall = time.time() - t0
    every = int(s.probe_every)
    steps = [min((i + 1) * every, int(s.clean_steps)) for i in range(len(history))]
    formed = next((st for st, chk in zip(steps, history)
                   if all(chk.get(f"{x}_summary_key_acc", 0.0) >= thr for x in summ)), None)
    return dict(probes=list(zip(steps, history)), formed_at=formed, wall_s=wall)


def main(argv=None):
    c = cli.load(argv, default="configs/selfsum_tiny.py", validate=ss.validate_config, derive=ss.apply_quick,
                 doc=__doc__, prog="benchmarks/selfsum_scope.py")
    provenance.announce(config=c, seeds=c.exp.seeds)
    res = {}
    for seed in progress.progress(c.exp.seeds, desc="scoping seeds", unit="seed"):
        cs = copy.deepcopy(c)
        cs.seed = int(seed)
        cs.exp.out_dir = f"{c.exp.out_dir}/scope/seed{seed}"
        _, tok, log, family = loop.start_run(cs)
        try:
            res[int(seed)] = scope_seed(cs, family, tok, log)
        finally:
            log.close()
    print(f"\nstage 1: {c.exp.sft.clean_steps} steps, {c.exp.sft.clean_batch_size} x {c.exp.sft.clean_seq_len} rows, "
          f"lr {c.exp.sft.clean_lr}, remat {c.exp.sft.get('remat', c.model.remat)}; threshold "
          f"{c.exp.report.copy_threshold} on every summarizing strategy")
    for seed, r in res.items():
        print(f"seed {seed}: copy formed at step {r['formed_at']} | wall {r['wall_s']:.0f} s incl. demos and probes")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
