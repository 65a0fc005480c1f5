#!/usr/bin/env python3
"""Build the real-repository images and generate SWE-bench instances from them (SPEC §5, §7; issue 26).

Per repository of envs/repos/manifest.toml (`horizon.tasks.repos`): fetch the pinned sdist with pip
on the host (sha256-checked), commit it as a git repository, build `horizon-repo:<name>-<version>`
FROM `horizon-sandbox:base` (labels: git tree hash, base image id; skipped when current), run the
suite twice in it (flaky tests excluded; baseline.json, skipped when current). With --candidates N:
validate N seeded mutation candidates per repository in Docker (`horizon.tasks.generate`; verdicts
cached per candidate content hash, so a rebuild is incremental), build an image per kept instance
(`horizon-swegen:<id>`), write SWE-bench JSONL (--out) and the per-repository report (--report).
Build state lives in envs/.build/repos/ (gitignored). Never pulls.

    python envs/build_repo_images.py                          # repository images + baselines only
    python envs/build_repo_images.py parse six --candidates 40 --out runs/swegen/instances.jsonl
    python envs/build_repo_images.py --force                  # rebuild images and baselines
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from horizon.sandbox.base import DEFAULT_BASE_IMAGE
from horizon.tasks import generate, repos, swebench
from horizon.tasks.task import TaskError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("names", nargs="*", help="repository names (default: all in the manifest)")
    ap.add_argument("--manifest", default=None, help="default: envs/repos/manifest.toml")
    ap.add_argument("--base-image", default=DEFAULT_BASE_IMAGE)
    ap.add_argument("--force", action="store_true", help="rebuild repository images and baselines")
    ap.add_argument("--candidates", type=int, default=0, help="mutation candidates per repository (0: images only)")
    ap.add_argument("--max-instances", type=int, default=0, help="instances per repository (0: every kept one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/swegen/instances.jsonl")
    ap.add_argument("--report", default=None, help="default: <out>.report.json")
    args = ap.parse_args(argv)
    try:
        specs = repos.select(repos.load_manifest(args.manifest), args.names)
    except TaskError as e:
        print(e, file=sys.stderr)
        return 2
    t0 = time.monotonic()
    instances, reports = [], []
    for i, spec in enumerate(specs, 1):
        t1 = time.monotonic()
        what, labels = repos.build_repo_image(spec, base_image=args.base_image, force=args.force)
        base = repos.screen_suite(spec, labels, force=args.force)
        print(f"[build_repo_images {i}/{len(specs)}] {spec.image}: {what}; {len(base['stable'])} stable tests, "
              f"{len(base['flaky'])} flaky, suite {base['suite_s']}s ({time.monotonic() - t1:.1f}s)", flush=True)
        if args.candidates:
            got, rep = generate.generate_repo(spec, base, n_candidates=args.candidates, seed=args.seed,
                                              max_instances=args.max_instances, base_image=args.base_image)
            instances += got
            reports.append(rep)
            print(f"[generate {spec.name}] {json.dumps(rep)}", flush=True)
    if args.candidates:
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        swebench.write_jsonl(instances, out)
        report = pathlib.Path(args.report or f"{out}.report.json")
        report.write_text(json.dumps({"repos": reports, "instances": len(instances),
                                      "seconds": round(time.monotonic() - t0, 1)}, indent=1) + "\n")
        print(f"[build_repo_images] {len(instances)} instances -> {out}; report {report}", flush=True)
    print(f"[build_repo_images] done: {len(specs)} repositories in {time.monotonic() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
