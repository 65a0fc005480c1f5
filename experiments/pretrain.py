"""Pretrain an LM on local code (docs/SPEC.md §8): `python experiments/pretrain.py --config=configs/tiny.py`.

    python experiments/pretrain.py --config=configs/tiny.py --config.train.steps=50 --config.train.output_dir=runs/x
    python experiments/pretrain.py --config=configs/pretrain_long.py      # short stage, then long (docs/SPEC.md §1.4)

One stage (a config without `stages`): logs train loss every `log_every` and held-out loss every
`eval_every` (and at step 0) to `<train.output_dir>/metrics.jsonl` and TensorBoard events there (W&B
with exp.wandb.project), checkpoints every `checkpoint_every`, resumes from the newest checkpoint in
that dir (also across meshes), and ends with a loss-curve PNG and a summary (with provenance)
(`horizon.train.loop`). The step runs on the mesh of `mesh` (docs/SPEC.md §2; default one device,
`--config.mesh.preset=ep4xcp2` etc. on 8 devices): params, optimizer state and batches placed by the
logical-axis rules, the one `lm.train_step` partitioned (`horizon.parallel.sharded`).

With `stages` (configs/pretrain_long.py): the short stage in `<output_dir>/short`, the long one
(`stages.long`: longer sequences, YaRN, the short stage's params, a fresh optimizer;
`horizon.train.stages`) in `<output_dir>/long`, each a stage as above that resumes on its own. The
long-context eval (`horizon.eval.long_context`: held-out loss per position bucket, passkey accuracy
at `long_eval.multiples` of the short length) runs on the short model with its own RoPE and with the
long stage's, then on the long model; its records go to `<output_dir>/metrics.jsonl` (phase
`long_context/<model>`, kept across a resume) and `<output_dir>/summary.json`. Bad config values stop
with one line and exit code 2 before anything starts (`stages.validate_pretrain_config`,
`long_context.validate_long_eval`).
"""

import json
import pathlib
import sys

from absl import logging

from horizon.eval import long_context
from horizon.train import loop, stages
from horizon.utils import cli
from horizon.utils.config import dump_config
from horizon.utils.provenance import Provenance
from horizon.utils.tracking import MetricsWriter


def validate(cfg) -> None:
    stages.validate_pretrain_config(cfg)
    long_context.validate_long_eval(cfg)


def run_stages(cfg, plan: list[stages.Stage], prov: Provenance) -> dict:
    """Both stages and the three long-context evals; returns the run's summary."""
    short, long = plan
    out = pathlib.Path(cfg.train.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.json")
    if not (out / "short" / "checkpoints").is_dir() and (out / "metrics.jsonl").exists():
        (out / "metrics.jsonl").unlink()                   # a fresh run: no evals to keep
    done = {r["phase"]: r for r in loop.read_records(out / "metrics.jsonl")}
    log = MetricsWriter(out, cfg)
    records = {}

    def run_eval(name, params, model_cfg, step):
        phase = f"long_context/{name}"
        if phase not in done:
            score = long_context.model_scorer(params, model_cfg)
            log({"phase": phase, "step": step, **long_context.evaluate(cfg, score, desc=f"eval {name}")})
            done[phase] = log.records[-1]
        records[name] = {k: v for k, v in done[phase].items() if k not in ("phase", "step", "time_s")}

    s_sum, s_state = loop.train_stage(short.cfg, prov, desc="pretrain short")
    n_short = short.cfg.train.steps
    run_eval("short", s_state.params, short.cfg.model, n_short)          # its own RoPE
    run_eval("short_yarn", s_state.params, long.cfg.model, n_short)     # the long stage's RoPE scaling
    l_sum, l_state = loop.train_stage(long.cfg, prov, desc="pretrain long", init_params=lambda: s_state.params)
    run_eval("long", l_state.params, long.cfg.model, n_short + long.cfg.train.steps)
    summary = {"stages": {"short": s_sum, "long": l_sum}, "long_context": records,
               "rope_scaling_long": long.cfg.model.rope_scaling.to_dict(), "provenance": prov.fields()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log.close(final={f"{m}/{k}": v for m, r in records.items() for k, v in r.items()})
    print("\nlong-context eval (held-out loss per target-position bucket; passkey exact match by length):\n"
          + long_context.table(records) + f"files: {out}/{{summary.json, metrics.jsonl, short/, long/}}")
    return summary


def main(argv=None):
    cfg = cli.load(argv, default="configs/tiny.py", validate=validate, doc=__doc__, prog="experiments/pretrain.py")
    logging.set_verbosity(logging.WARNING)  # orbax logs every save/restore at INFO
    prov = Provenance.start(cfg)
    plan = stages.plan(cfg)
    if len(plan) == 1:
        return loop.train_stage(plan[0].cfg, prov)[0]
    return run_stages(cfg, plan, prov)


if __name__ == "__main__":
    main(sys.argv[1:])
