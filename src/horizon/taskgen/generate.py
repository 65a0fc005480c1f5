"""SWE-bench-format instances generated from real repositories by validated bug injection
(docs/SPEC.md §5, §7). Options: `GenOptions` (configs/swegen.py `gen`).

For one repository of `repos` (its image built and its baseline screened), `generate_repo`:

0. Coverage map (`coverage.coverage_map`, once per repository image, cached in ``coverage.json``):
   one suite run with the generator's pytest plugin records, per test, the functions under
   /workspace it called (keyed "path:first line").
1. Candidates (`candidates`): `mutate.sample` over each mutable module (`repos.source_files`),
   deduplicated, in a seeded order; the first `n_candidates` that some stable test can observe
   (`coverage.tests_for`: the tests that called a function the mutation changes; module- or
   class-level code runs at import, so every test) are kept, the others skipped unrun
   ("uncovered_skipped"). `n_features` feature deletions the same way. After their validation,
   `n_combined` combinations of `combine_size` kept single-site bugs of one module.
2. Validation in Docker (`validation`: `workers` threads, each with its own container): the
   mutated module is written, the candidate's tests run and the tree is restored in one exec. Kept
   iff the run finished, at least one selected stable test fails, and every other selected one
   passes (`verdicts.verdict`; a test missing from the report rejects). FAIL_TO_PASS = the failing
   tests, PASS_TO_PASS = every other stable test; flaky tests are in neither.
3. Each verdict is cached under ``cache/<key>.json`` (`verdicts.candidate_key`: the repository's
   tree hash, the module path, the mutated source and `verdicts.GEN_FORMAT`), so a rebuild only
   validates new candidates.
4. A kept candidate becomes an instance (`instances`): image ``horizon-swegen:<task id>`` (the
   base image + the repository with the bug as a fresh one-commit git repository), ``patch`` = the
   gold patch, a problem statement from the failing tests. Images are built by `workers` threads,
   skipped when current (labels). `max_instances` picks round-robin over the kinds.

`generate_repo` returns the instances (with the given `split`) and a report (candidates, cached,
kept, rejected by reason, kinds, uncovered, timings, candidates per minute); `set_report` and
`report_table` summarise a set; `swebench.write_jsonl` writes them.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import os
import pathlib
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from horizon.sandbox.base import DEFAULT_BASE_IMAGE
from horizon.taskgen import candidates, coverage, instances, mutate, repos, validation
from horizon.tasks import swebench
from horizon.utils.config import need_int
from horizon.utils.progress import progress, say


@dataclasses.dataclass(frozen=True)
class GenOptions:
    """What `generate_repo` makes of each repository (configs/swegen.py `gen`, `build_root`,
    `base_image`, `build_images`); checked on construction (`horizon.utils.config.ConfigError`,
    one line naming the ``gen.`` field)."""
    n_candidates: int                 # single-site mutations (mutate.KINDS) validated
    n_features: int = 0               # feature deletions (mutate.FEATURE_KIND) validated
    n_combined: int = 0               # combinations of kept single-site bugs of one module (mutate.COMBINED_KIND)
    combine_size: int = 2             # bugs per combination
    seed: int = 0
    max_instances: int = 0            # 0 = every kept candidate becomes an instance
    workers: int = 1                  # validation containers (threads) per repository; image builds too
    select_tests: bool = True         # run only the tests that ran the mutated code (coverage map)
    root: str | os.PathLike | None = None          # build directory (None = repos.BUILD_ROOT)
    build_images: bool = True         # one image per instance (False: instances without images)
    base_image: str = DEFAULT_BASE_IMAGE
    image_repo: str = instances.INSTANCE_IMAGE_REPO   # instance images are tagged <image_repo>:<task id>
    extra_labels: dict[str, str] = dataclasses.field(default_factory=dict)   # on every instance image

    def __post_init__(self):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for k in ("n_candidates", "n_features", "n_combined", "max_instances", "seed"):
            need_int(fields, k, "gen", lo=0)
        need_int(fields, "combine_size", "gen", lo=2)
        need_int(fields, "workers", "gen", lo=1)


def generate_repo(spec: repos.RepoSpec, baseline: dict, options: GenOptions, *, split: str | None = None,
                  client=None, log=say) -> tuple[list[swebench.SweInstance], dict]:
    """(instances, report) for one repository (module docstring); `split` is written on every
    instance; `client`: a docker client for the image builds (default: from the environment).
    Validation and the instance images each run under a progress bar; `log` lines print above it."""
    o, t0 = options, time.monotonic()
    repo_src = repos.prepare_repo(spec, o.root)
    files, _ = swebench.repo_tree(repo_src, "HEAD")
    cov = coverage.coverage_map(spec, baseline, root=o.root) if o.select_tests else None
    paths = repos.source_files(files, spec)
    timing = {"coverage_s": round(time.monotonic() - t0, 1)}
    jobs, uncovered = candidates.first_jobs(files, paths, cov, baseline, n_candidates=o.n_candidates,
                                            n_features=o.n_features, seed=o.seed)
    t1 = time.monotonic()

    def validate(batch):
        return validation.validate_cached(spec, baseline, batch, root=o.root, workers=o.workers, log=log, t0=t0)
    verdicts, cached = validate(jobs)
    if o.n_combined:
        kept_singles = [m for m, _, v in verdicts if v.status == "kept" and m.kind in mutate.KINDS]
        combos = candidates.combinations(kept_singles, o.n_combined, o.combine_size, o.seed + 2)
        more, more_cached = validate([(m, coverage.tests_for(cov, baseline, m)) for m in combos])
        verdicts, cached = verdicts + more, cached + more_cached
    timing["validate_s"] = round(time.monotonic() - t1, 1)
    kept = round_robin([x for x in verdicts if x[2].status == "kept"], o.max_instances)
    t2 = time.monotonic()
    insts, built = build_instances(spec, kept, repo_src, o, split=split, client=client)
    timing["images_s"] = round(time.monotonic() - t2, 1)
    report = repo_report(spec, verdicts, insts, cached=cached, images_built=built, seconds=time.monotonic() - t0)
    report.update(uncovered_skipped=uncovered, split=split, **timing)
    if len(verdicts) > cached:
        report["candidates_per_min"] = round(60.0 * (len(verdicts) - cached) / max(timing["validate_s"], 1e-6), 1)
    return insts, report


def round_robin(kept: list[tuple], n: int) -> list[tuple]:
    """The first `n` of the kept [(mutation, key, verdict)] taken in turn from single-site bugs,
    deleted features and combinations (`mutate.EXTRA_KINDS`); all of them, in order, when `n` is 0."""
    if not n:
        return kept
    groups = [[x for x in kept if (x[0].kind if x[0].kind in mutate.EXTRA_KINDS else "single") == g]
              for g in ("single", *mutate.EXTRA_KINDS)]
    return [x for tier in itertools.zip_longest(*groups) for x in tier if x is not None][:n]


def build_instances(spec: repos.RepoSpec, kept: list[tuple], repo_src, o: GenOptions, *, split: str | None,
                    client=None) -> tuple[list[swebench.SweInstance], int]:
    """(the instances of the kept [(mutation, key, verdict)], how many images were built), by
    `o.workers` threads; without `o.build_images` only their ``base_commit`` is made."""
    def build(item):
        m, key, v = item
        if o.build_images:
            tag, commit, what = instances.build_instance(spec, m, key, repo_src, base_image=o.base_image,
                                                         client=client, extra_labels=o.extra_labels,
                                                         image_repo=o.image_repo)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                tag, commit, what = None, instances.bug_commit(repo_src, m, pathlib.Path(tmp) / "repo"), "none"
        return instances.make_instance(spec, m, v, key, commit, tag, split), what == "built"
    desc = f"{'instance images' if o.build_images else 'instances'} {spec.name}"
    with ThreadPoolExecutor(max(1, int(o.workers))) as ex:
        results = ex.map(build, kept)
        built = list(progress(results, total=len(kept), desc=desc, unit="instance", leave=False) if kept else results)
    return [i for i, _ in built], sum(b for _, b in built)


def hold_out_unseen(instances: list, fraction: float) -> tuple[list, list]:
    """(train, unseen): per repository, the `fraction` of its instances with the lowest sha256 of
    their id (rounded, at least one where `fraction` > 0 and the repository has two) are unseen
    instances of a train repository, never demonstrated or trained on (docs/REAL_REPOS.md);
    deterministic, and stable as instances are added."""
    by_repo: dict[str, list] = collections.defaultdict(list)
    for i in instances:
        by_repo[i.repo].append(i)
    unseen = set()
    for items in by_repo.values():
        k = min(len(items) - 1, max(1 if fraction > 0 else 0, round(fraction * len(items))))
        ranked = sorted(items, key=lambda i: hashlib.sha256(i.instance_id.encode()).hexdigest())
        unseen.update(i.instance_id for i in ranked[:k])
    return [i for i in instances if i.instance_id not in unseen], [i for i in instances if i.instance_id in unseen]


def _count(items) -> dict:
    return dict(sorted(collections.Counter(items).items()))


def repo_report(spec, verdicts, insts, *, cached: int, images_built: int, seconds: float) -> dict:
    """The per-repository report: candidates, cached, kept, rejected by reason, kinds tried / kept."""
    return {"repo": spec.repo, "version": spec.version, "candidates": len(verdicts), "cached": cached,
            "validated": len(verdicts) - cached, "kept": sum(v.status == "kept" for _, _, v in verdicts),
            "instances": len(insts), "images_built": images_built,
            "rejected": _count(v.status for _, _, v in verdicts if v.status != "kept"),
            "kinds_tried": _count(m.kind for m, _, _ in verdicts),
            "kinds_kept": _count(i.extra["metadata"]["kind"] for i in insts), "seconds": round(seconds, 1)}


def set_report(reports: list[dict], splits: dict[str, list], *, seconds: float) -> dict:
    """The whole set's report: per-repository reports, instances per split, per kind and per repository."""
    kinds = collections.Counter()
    for r in reports:
        kinds.update(r["kinds_kept"])
    n = sum(len(v) for v in splits.values())
    return {"instances": n, "splits": {k: len(v) for k, v in splits.items()},
            "split_repos": {k: sorted({i.repo for i in v}) for k, v in splits.items()},
            "repositories_with_instances": sum(r["instances"] > 0 for r in reports),
            "kinds": dict(sorted(kinds.items())), "candidates": sum(r["candidates"] for r in reports),
            "validated": sum(r["validated"] for r in reports), "seconds": round(seconds, 1), "repos": reports}


def report_table(report: dict) -> str:
    """The per-repository table of `set_report` (markdown): candidates, kept, instances, kinds kept, time."""
    rows = ["| repository | split | candidates | validated | kept | instances | uncovered skipped | kinds kept | s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in report["repos"]:
        kinds = ", ".join(f"{k} {n}" for k, n in r["kinds_kept"].items())
        rows.append(f"| {r['repo']} | {r.get('split') or ''} | {r['candidates']} | {r['validated']} | {r['kept']} | "
                    f"{r['instances']} | {r.get('uncovered_skipped', 0)} | {kinds} | {r['seconds']} |")
    kinds = ", ".join(f"{k} {n}" for k, n in report["kinds"].items())
    rows.append(f"| **all** | {report['splits']} | {report['candidates']} | {report['validated']} | | "
                f"{report['instances']} | | {kinds} | {report['seconds']} |")
    return "\n".join(rows)
