#!/usr/bin/env python3
"""Build the real-repository images and generate SWE-bench instances from them (docs/SPEC.md §5, §7).

Per repository of envs/repos/manifest.toml (`horizon.taskgen.repos`): fetch the pinned sdist with pip
on the host (sha256-checked), commit it as a git repository, build `horizon-repo:<name>-<version>`
FROM `horizon-sandbox:base` (labels: git tree hash, base image id; skipped when current), run the
suite twice in it (flaky tests excluded; baseline.json, skipped when current). With
`gen.n_candidates` > 0 (configs/swegen.py): map which tests run which function (one traced run,
coverage.json), validate seeded mutation candidates in Docker with `gen.workers` containers
(`horizon.taskgen.generate`; verdicts cached per candidate content hash, so a rebuild is incremental),
build an image per kept instance (`horizon-swegen:<id>`), and write `out_dir`/train.jsonl and
heldout.jsonl (split by repository; with `unseen_fraction` > 0 also unseen.jsonl: that fraction of
each train repository's instances, `generate.hold_out_unseen`) and report.json (with the run's
`provenance`: commit, config hash, seed, start, wall time, load). Never pulls. Progress bars with
ETA run over the repositories and, per repository, over the candidates validated and the instance
images built; wall time is printed.

    python envs/build_repo_images.py                                            # images + baselines only
    python envs/build_repo_images.py --config.repos='("parse","six")' --config.gen.n_candidates=40
    python envs/build_repo_images.py --config.gen.n_candidates=40 --config.gen.n_features=8 \
        --config.gen.n_combined=8            # the full set (docs/PERF.md, "Real-repository task generator")
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

from horizon.taskgen import generate, repos
from horizon.tasks import swebench
from horizon.tasks.task import TaskError
from horizon.utils import cli
from horizon.utils.config import ConfigError, need_float, need_int
from horizon.utils.progress import progress, say
from horizon.utils.provenance import Provenance

MANIFEST_HELDOUT = "__manifest__"


def gen_options(c) -> generate.GenOptions:
    """The generator's options from the config (`generate.GenOptions` checks the `gen` fields)."""
    g = c.gen
    return generate.GenOptions(n_candidates=g.n_candidates, n_features=g.n_features, n_combined=g.n_combined,
                               combine_size=g.combine_size, seed=g.seed, max_instances=g.max_instances,
                               workers=g.workers, select_tests=bool(g.select_tests), root=c.build_root or None,
                               base_image=c.base_image, build_images=bool(c.build_images))


def validate(c) -> None:
    gen_options(c)
    need_int(c, "baseline_runs", "config", lo=1)
    need_float(c, "unseen_fraction", "config", 0.0, 0.5)
    try:
        specs = repos.select(repos.load_manifest(c.manifest or None), list(c.repos))
        heldout_names(c)
    except TaskError as e:
        raise ConfigError(str(e)) from None
    if not specs:
        raise ConfigError("repos: selects no repository")


def heldout_names(c) -> list[str]:
    """The held-out repository names: the manifest's `heldout` list, or the config's."""
    names = list(c.heldout)
    if names == [MANIFEST_HELDOUT]:
        return repos.manifest_heldout(c.manifest or None)
    repos.select(repos.load_manifest(c.manifest or None), names)    # unknown names raise
    return names


def main(argv: list[str] | None = None) -> int:
    c = cli.load(argv, default="configs/swegen.py", validate=validate, doc=__doc__, prog="envs/build_repo_images.py")
    prov = Provenance.start(c, seeds=c.gen.seed)
    opts = gen_options(c)
    root = opts.root
    specs = repos.select(repos.load_manifest(c.manifest or None), list(c.repos))
    heldout = set(heldout_names(c))
    t0 = time.monotonic()
    splits: dict[str, list] = {"train": [], "heldout": []}
    reports = []
    for i, spec in enumerate(progress(specs, desc="repositories", unit="repo"), 1):
        t1 = time.monotonic()
        what, labels = repos.build_repo_image(spec, root=root, base_image=c.base_image, force=bool(c.force))
        base = repos.screen_suite(spec, labels, root=root, runs=int(c.baseline_runs), force=bool(c.force))
        say(f"[build_repo_images {i}/{len(specs)}] {spec.image}: {what}; {len(base['stable'])} stable tests, "
            f"{len(base['flaky'])} flaky, suite {base['suite_s']}s ({time.monotonic() - t1:.1f}s)")
        if opts.n_candidates or opts.n_features:
            split = "heldout" if spec.name in heldout else "train"
            got, rep = generate.generate_repo(spec, base, opts, split=split)
            splits[split] += got
            reports.append(rep)
            say(f"[generate {spec.name}] {json.dumps(rep)}")
    if float(c.unseen_fraction) > 0:
        splits["train"], splits["unseen"] = generate.hold_out_unseen(splits["train"], float(c.unseen_fraction))
    if opts.n_candidates or opts.n_features:
        out = pathlib.Path(c.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, insts in splits.items():
            swebench.write_jsonl(insts, out / f"{name}.jsonl")
        report = dict(generate.set_report(reports, splits, seconds=time.monotonic() - t0), provenance=prov.fields())
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        print(generate.report_table(report), flush=True)
        print(f"[build_repo_images] {report['instances']} instances from {report['repositories_with_instances']} "
              f"repositories ({', '.join(f'{k} {len(v)}' for k, v in splits.items())}) -> {out}/"
              f"{{{','.join(splits)}}}.jsonl, report.json", flush=True)
    print(f"[build_repo_images] done: {len(specs)} repositories in {time.monotonic() - t0:.1f}s wall", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
