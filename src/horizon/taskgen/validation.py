"""Validating candidates in Docker (docs/SPEC.md §5, §7; `generate` docstring, step 2).

Each worker thread has its own container of the repository image with the generator's pytest
plugin installed. Per candidate the mutated module is written, then one exec runs the selected
tests and restores the tree (``git checkout`` + ``git clean``); the timeout scales with the number
of tests selected. `validate_cached` puts the verdict cache (`verdicts`) in front of the pool.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from horizon.sandbox.base import WORKSPACE
from horizon.sandbox.factory import open_sandbox
from horizon.taskgen import coverage, mutate, repos, verdicts
from horizon.tasks.task import TaskError
from horizon.utils.progress import progress

MIN_TIMEOUT_S = 20.0
RESTORE = "git checkout -q -- . && git clean -fdq"


def suite_timeout(baseline: dict, n_tests: int | None = None) -> float:
    """Per-candidate timeout (catches mutations that loop forever): 3x the slowest baseline run,
    scaled by the fraction of the stable tests selected (at least a quarter), at least 20 s."""
    frac = 1.0 if n_tests is None else max(0.25, n_tests / max(1, len(baseline["stable"])))
    return max(MIN_TIMEOUT_S, 3.0 * float(baseline["suite_s"]) * frac)


def validate_one(sandbox, spec, baseline, m: mutate.Mutation, tests=None) -> verdicts.Verdict:
    """Run the stable `tests` (default: the whole suite) with `m` applied in `sandbox` (the
    repository image, plugin installed), then restore the tree (one exec runs and restores)."""
    stable = list(baseline["stable"]) if tests is None else list(tests)
    sandbox.write_file(f"{WORKSPACE}/{m.path}", m.source)
    env = ""
    if tests is not None and len(stable) < len(baseline["stable"]):
        sandbox.write_file(coverage.SELECT_PATH, "\n".join(stable) + "\n")
        env = f"HORIZON_SELECT={coverage.SELECT_PATH}"
    statuses, report, timed_out = repos.run_suite(sandbox, coverage.plugin_command(spec, env) + "; " + RESTORE,
                                                  suite_timeout(baseline, len(stable)))
    if timed_out or not sandbox.alive():
        if not sandbox.alive():
            raise TaskError(f"{spec.image}: the validation container died")
        sandbox.prepare()   # ends what the timed-out run left behind (and clears /tmp: the plugin too)
        r = sandbox.exec(RESTORE, timeout=60.0, workdir=WORKSPACE)
        if not r.ok:
            raise TaskError(f"{spec.image}: restoring the tree failed: {r.output[-300:]}")
        coverage.install_plugin(sandbox)
    if not statuses and not timed_out and not sandbox.exec(f"test -f {coverage.PLUGIN_PATH}", timeout=30.0,
                                                          workdir="/").ok:
        raise TaskError(f"{spec.image}: the generator's pytest plugin is gone from the container")
    v = verdicts.verdict(statuses, stable, timed_out, verdicts.failure_messages(report))
    if v.status == "kept" and len(stable) < len(baseline["stable"]):
        # the stable tests not run never call the mutated code (`coverage.tests_for`): they pass as at baseline
        f2p = set(v.fail_to_pass)
        v = dataclasses.replace(v, pass_to_pass=tuple(t for t in baseline["stable"] if t not in f2p))
    return v


def validate_many(spec, baseline, jobs, *, workers: int = 1, log=None,
                  t0: float | None = None) -> list[verdicts.Verdict]:
    """Verdicts of `jobs` [(mutation, tests)] in order, validated by a pool of `workers` threads,
    each with its own container of the repository image (opened on its first job); a progress bar
    (``validate <name>``, candidates) runs over them."""
    if not jobs:
        return []
    local, boxes, lock = threading.local(), [], threading.Lock()
    done = [0]
    t0 = time.monotonic() if t0 is None else t0
    bar = progress(total=len(jobs), desc=f"validate {spec.name}", unit="candidate", leave=False)

    def run(job):
        m, tests = job
        sb = getattr(local, "sb", None)
        if sb is None:
            sb = local.sb = open_sandbox("docker", spec.image, default_timeout=600.0, **repos.SANDBOX_LIMITS)
            with lock:
                boxes.append(sb)
            coverage.install_plugin(sb)
        v = validate_one(sb, spec, baseline, m, tests)
        with lock:
            done[0] += 1
            bar.update(1)
            if log and done[0] % 25 == 0:
                log(f"[generate {spec.name}] validated {done[0]}/{len(jobs)} ({time.monotonic() - t0:.0f}s)")
        return v
    try:
        with ThreadPoolExecutor(max(1, min(int(workers), len(jobs) or 1))) as ex:
            return list(ex.map(run, jobs))
    finally:
        bar.close()
        for sb in boxes:
            sb.close()


def validate_cached(spec, baseline, jobs, *, root=None, workers: int = 1, log=None,
                    t0: float | None = None) -> tuple[list[tuple], int]:
    """([(mutation, key, verdict)] for `jobs` [(mutation, tests)] in order, how many were cached):
    cached verdicts (`verdicts.candidate_key` over the repository's tree) are reused, the others
    validated by `validate_many` and stored."""
    tree = baseline["labels"][repos.LABEL_TREE]
    keyed = [(m, verdicts.candidate_key(tree, m), tests) for m, tests in jobs]
    got = {k: verdicts.load_cached(root, spec, k) for _, k, _ in keyed}
    todo = [(m, tests) for m, k, tests in keyed if got[k] is None]
    for (m, _), v in zip(todo, validate_many(spec, baseline, todo, workers=workers, log=log, t0=t0)):
        k = verdicts.candidate_key(tree, m)
        verdicts.store_cached(root, spec, k, v)
        got[k] = v
    return [(m, k, got[k]) for m, k, _ in keyed], len(keyed) - len(todo)
