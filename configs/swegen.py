"""Task generator config (docs/SPEC.md §5, §7): SWE-bench instances from the real repositories
of envs/repos/manifest.toml, built by envs/build_repo_images.py (`horizon.taskgen.generate`).

    python envs/build_repo_images.py --config=configs/swegen.py                        # images + baselines only
    python envs/build_repo_images.py --config=configs/swegen.py --config.gen.n_candidates=40 \
        --config.gen.n_features=8 --config.gen.n_combined=8 --config.out_dir=runs/swegen  # the full set
    python envs/build_repo_images.py --config.repos='("parse","six")' --config.gen.n_candidates=40

Writes `out_dir`/train.jsonl and heldout.jsonl (SWE-bench JSONL with image tags; the held-out
repositories are the manifest's `heldout` list unless `heldout` is set here) and report.json
(per repository: candidates, cached, kept, rejected by reason, kinds tried / kept, timings; and the
run's provenance: commit, config hash, seed, start, wall time, load average).
Verdicts are cached per candidate content hash under `build_root`, so a second run is incremental.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.repos = ()                      # repository names of the manifest (empty = all)
    c.manifest = ""                   # "" = envs/repos/manifest.toml
    c.build_root = ""                 # build state (sdists, repos, baselines, coverage, verdict cache);
    #                                   "" = envs/.build/repos
    c.base_image = "horizon-sandbox:base"
    c.force = False                   # rebuild repository images, baselines and coverage maps
    c.baseline_runs = 2               # suite runs per repository for flaky screening
    c.heldout = ("__manifest__",)     # held-out repository names; ("__manifest__",) = the manifest's `heldout`
    c.out_dir = "runs/swegen"         # train.jsonl, heldout.jsonl, report.json
    c.unseen_fraction = 0.0           # this fraction of each train repository's instances -> unseen.jsonl (never
    #                                   demonstrated or trained on: the train repositories' own held-out instances)
    c.build_images = True             # one horizon-swegen:<id> image per instance (False: JSONL without images)
    c.gen = ml_collections.ConfigDict(dict(
        n_candidates=0,               # single-site mutations validated per repository (0 = images and baselines only)
        n_features=0,                 # feature deletions (a tested function's body -> raise NotImplementedError)
        n_combined=0,                 # combinations of kept single-site bugs in one module
        combine_size=2,               # bugs per combination
        seed=0,
        max_instances=0,              # instances per repository (0 = every kept candidate)
        workers=2,                    # validation containers per repository (= cores to use), image builds too
        select_tests=True,            # run only the tests that ran the mutated function (coverage map)
    ))
    return c
