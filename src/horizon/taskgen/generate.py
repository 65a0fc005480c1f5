"""SWE-bench-format instances generated from real repositories by validated bug injection
(SPEC §5 sandboxes, §7 tasks; issue 26 items 2-3). Options: `GenOptions` (configs/swegen.py `gen`).

For one repository of `repos` (its image built and its baseline screened):

0. Coverage map (`coverage_map`, once per repository image, cached in ``coverage.json``): one suite
   run with a pytest plugin (`PLUGIN_SOURCE`, a ``sys.settrace`` call hook that never traces
   lines) records, per test, the functions under /workspace it called (keyed "path:first line").
1. Candidates: `mutate.sample` over each mutable module (`repos.source_files`), a seeded number
   per file, duplicates (same path and mutated source) removed, in a seeded order; the first
   `n_candidates` that some stable test can observe (`tests_for`: the tests that called a function
   the mutation changes; module- or class-level code runs at import, so every test) are kept, the
   others skipped unrun ("uncovered_skipped"). `n_features` feature deletions
   (`mutate.feature_deletions`) the same way. After their validation, `n_combined` combinations
   (`mutate.combine`) of `combine_size` kept single-site bugs of one module.
2. Validation in Docker (`validate_many`: `workers` threads, each with its own container of the
   repository image): the mutated module is written, the candidate's tests run (the per-test
   report `swebench.grade` reads) and the tree is restored (``git checkout`` + ``git clean``) in
   one exec; timeout scaled to the selected tests (`suite_timeout`). Kept iff the run finished, at
   least one selected stable test fails, and every other selected one passes (`verdict`; a test
   missing from the report, e.g. an import error at collection, rejects). FAIL_TO_PASS = the
   failing tests, PASS_TO_PASS = every other stable test (those not run never call the changed
   code); flaky tests are in neither.
3. Each verdict is cached under ``cache/<key>.json`` (`candidate_key`: sha256 of the repository's
   tree hash, the module path, the mutated source and `GEN_FORMAT`), so a rebuild only validates
   new candidates.
4. A kept candidate becomes an instance: image ``horizon-swegen:<task id>`` = the base image + the
   repository with the bug, committed as a fresh single-commit git repository (the clean code is
   not in its history; fixed identity and date, so ``base_commit`` is reproducible); ``patch`` =
   the mutation's gold patch (the inverse diff); ``test_patch`` empty (the tests already exist;
   `swebench.grade` restores the instance's test files from ``base_commit``);
   ``problem_statement`` from the failing tests' names and assertion messages (`problem_statement`,
   no language model; a deleted feature's names the function). Images are built by `workers`
   threads, skipped when current (labels). `max_instances` picks round-robin over the kinds.

`generate_repo` returns the instances (with the given `split`) and a report (candidates, cached,
kept, rejected by reason, kinds, uncovered, timings, candidates per minute); `set_report` and
`report_table` summarise a set; `swebench.write_jsonl` writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import random
import re
import shutil
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

from horizon.sandbox.base import DEFAULT_BASE_IMAGE, PROJECT_LABEL, WORKSPACE
from horizon.taskgen import mutate, repos
from horizon.tasks import swebench
from horizon.tasks.task import TaskError
from horizon.sandbox.factory import open_sandbox

GEN_FORMAT = "4"                  # bump when validation or instance layout changes (invalidates the cache)
INSTANCE_IMAGE_REPO = "horizon-swegen"
LABEL_INSTANCE = PROJECT_LABEL + ".instance_id"
LABEL_INSTANCE_HASH = PROJECT_LABEL + ".instance_hash"
MAX_LISTED_FAILURES = 8
MAX_MESSAGE_CHARS = 300
WIDE = "export COLUMNS=400; "      # pytest cuts summary messages at the terminal width (80 off a tty)
_FAIL_LINE_RE = re.compile(r"^(FAILED|ERROR) (\S+?)(?: - (.*))?$")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The validation outcome of one candidate."""
    status: str                    # "kept" | "no_failure" | "missing" | "timeout"
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    messages: dict                 # failing test id -> assertion message (pytest's short summary)


def candidate_key(tree: str, m: mutate.Mutation) -> str:
    """Cache key of a candidate: sha256 of the repository tree hash, path, mutated source, format."""
    h = hashlib.sha256()
    for part in (GEN_FORMAT, tree, m.path, m.source):
        h.update(part.encode("utf-8") + b"\0")
    return h.hexdigest()


def file_seed(seed: int, path: str) -> int:
    """The per-module sampling seed (stable across runs and Python versions)."""
    return (seed * 1_000_003 + zlib.crc32(path.encode("utf-8"))) % (2**31)


def candidate_mutations(files: dict[str, str], paths, n_candidates: int, seed: int, per_file: int = 0,
                        kinds=None) -> list[mutate.Mutation]:
    """Up to `n_candidates` distinct mutations of the modules `paths` of `files` (module docstring,
    step 1); `per_file` 0 = enough per module to reach `n_candidates` twice over."""
    paths = list(paths)
    if not paths:
        raise TaskError("no mutable source files")
    per_file = per_file or max(2, -(-2 * n_candidates // len(paths)))
    seen, out = set(), []
    for p in paths:
        try:
            ms = mutate.sample(files[p], per_file, file_seed(seed, p), p, kinds)
        except mutate.MutationError:
            continue
        for m in ms:
            if (m.path, m.source) not in seen:
                seen.add((m.path, m.source))
                out.append(m)
    random.Random(seed).shuffle(out)
    return out[:n_candidates]


def failure_messages(report: str) -> dict[str, str]:
    """Failing test id -> its short-summary message (``FAILED id - msg``) from a ``-rA`` report."""
    out = {}
    for line in report.splitlines():
        m = _FAIL_LINE_RE.match(line.rstrip())
        if m and m.group(2) not in out:
            out[m.group(2)] = (m.group(3) or m.group(1).lower()).strip()[:MAX_MESSAGE_CHARS]
    return out


def verdict(statuses: dict[str, str], stable, timed_out: bool, messages: dict | None = None) -> Verdict:
    """The rule of step 2: kept iff not timed out, no stable test missing, >= 1 stable test failing."""
    stable = list(stable)
    if timed_out:
        return Verdict("timeout", (), (), {})
    if any(t not in statuses for t in stable):
        return Verdict("missing", (), (), {})
    f2p = tuple(t for t in stable if statuses[t] not in swebench.PASS_STATUSES)
    p2p = tuple(t for t in stable if statuses[t] in swebench.PASS_STATUSES)
    if not f2p:
        return Verdict("no_failure", (), p2p, {})
    msgs = {t: (messages or {}).get(t, statuses[t].lower()) for t in f2p}
    return Verdict("kept", f2p, p2p, msgs)


def _failing_lines(v: Verdict) -> list[str]:
    lines = []
    for t in v.fail_to_pass[:MAX_LISTED_FAILURES]:
        msg = v.messages.get(t, "")
        lines.append(f"- {t}" + (f": {msg}" if msg else ""))
    if len(v.fail_to_pass) > MAX_LISTED_FAILURES:
        lines.append(f"- ... and {len(v.fail_to_pass) - MAX_LISTED_FAILURES} more")
    return lines


def problem_statement(spec: repos.RepoSpec, v: Verdict, m: mutate.Mutation | None = None) -> str:
    """The issue text of a kept candidate (no language model): which tests fail and how, no location;
    for a deleted feature (`mutate.FEATURE_KIND`) the function to write back and its failing tests."""
    n = len(v.fail_to_pass)
    if m is not None and m.kind == mutate.FEATURE_KIND:
        lines = [f"`{m.function}` in `{m.path}` of {spec.name} (version {spec.version} in /workspace) is not "
                 "implemented: it raises NotImplementedError.", "",
                 f"Implement it. {n} test{'s' if n != 1 else ''} of the suite exercise{'' if n != 1 else 's'} it "
                 "and fail now:"]
        lines += _failing_lines(v)
        lines += ["", "Make these tests pass without breaking the rest of the test suite. Do not change the tests."]
        return "\n".join(lines)
    lines = [f"Some of {spec.name}'s tests fail (version {spec.version} in /workspace).", "",
             f"{n} failing test{'s' if n != 1 else ''}:"]
    lines += _failing_lines(v)
    lines += ["", "Fix the library code so that these tests pass and the rest of the test suite still "
              "passes. Do not change the tests."]
    return "\n".join(lines)


def instance_id(spec: repos.RepoSpec, m: mutate.Mutation, key: str) -> str:
    """SWE-bench-style id: ``<name>__<kind>-<key[:10]>``."""
    return f"{spec.name}__{m.kind}-{key[:10]}"


def make_instance(spec: repos.RepoSpec, m: mutate.Mutation, v: Verdict, key: str, base_commit: str,
                  image: str | None, split: str | None = None) -> swebench.SweInstance:
    """The `SweInstance` of a kept candidate (module docstring, step 4)."""
    if v.status != "kept":
        raise TaskError(f"{m.location}: candidate was not kept ({v.status})")
    extra = {"metadata": {"generator": "horizon.taskgen.generate", "format": GEN_FORMAT, "kind": m.kind,
                          "file": m.path, "line": m.line, "function": m.function, "description": m.description,
                          "version": spec.version, "key": key}}
    return swebench.SweInstance(instance_id(spec, m, key), spec.repo, base_commit, m.gold_patch, "",
                                problem_statement(spec, v, m), v.fail_to_pass, v.pass_to_pass, image, split, extra)


def _cache_path(root, spec, key) -> pathlib.Path:
    return repos.repo_dir(spec, root) / "cache" / f"{key}.json"


def load_cached(root, spec, key) -> Verdict | None:
    p = _cache_path(root, spec, key)
    if not p.is_file():
        return None
    d = json.loads(p.read_text())
    return Verdict(d["status"], tuple(d["fail_to_pass"]), tuple(d["pass_to_pass"]), d["messages"])


def store_cached(root, spec, key, v: Verdict) -> None:
    p = _cache_path(root, spec, key)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dataclasses.asdict(v)) + "\n")


MIN_TIMEOUT_S = 20.0


def suite_timeout(baseline: dict, n_tests: int | None = None) -> float:
    """Per-candidate timeout (catches mutations that loop forever): 3x the slowest baseline run,
    scaled by the fraction of the stable tests selected (at least a quarter), at least 20 s."""
    frac = 1.0 if n_tests is None else max(0.25, n_tests / max(1, len(baseline["stable"])))
    return max(MIN_TIMEOUT_S, 3.0 * float(baseline["suite_s"]) * frac)


# The pytest plugin the generator puts into its containers (``-p horizon_gen_plugin``). Two jobs:
# HORIZON_COVERAGE_OUT=file: per test (setup, call, teardown), the code objects under /workspace it
# ran (a `sys.settrace` call hook that records the frame's code and never traces lines), written as
# {test id: ["path:first line", ...]}; HORIZON_SELECT=file: run only the test ids listed there.
PLUGIN_SOURCE = r'''
import json, os, sys, threading
import pytest

_OUT = os.environ.get("HORIZON_COVERAGE_OUT")
_SEL = os.environ.get("HORIZON_SELECT")
_ROOT = "/workspace/"
_calls, _cur = {}, [None]


def _tracer(frame, event, arg):
    if _cur[0] is not None:
        _cur[0].add(frame.f_code)


def pytest_collection_modifyitems(session, config, items):
    if _SEL:
        with open(_SEL) as f:
            keep = set(f.read().split("\n"))
        sel = [i for i in items if i.nodeid in keep]
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in keep])
        items[:] = sel


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _OUT:
        yield
        return
    _cur[0] = set()
    sys.settrace(_tracer)
    threading.settrace(_tracer)
    try:
        yield
    finally:
        sys.settrace(None)
        threading.settrace(None)
        _calls[item.nodeid] = _cur[0]
        _cur[0] = None


def pytest_sessionfinish(session):
    if _OUT:
        cov = {n: sorted({f"{c.co_filename[len(_ROOT):]}:{c.co_firstlineno}" for c in codes
                          if c.co_filename.startswith(_ROOT)}) for n, codes in _calls.items()}
        with open(_OUT, "w") as f:
            json.dump(cov, f)
'''
PLUGIN_DIR = "/tmp/horizon_gen"
SELECT_PATH = PLUGIN_DIR + "/select.txt"
COVERAGE_PATH = PLUGIN_DIR + "/coverage.json"


def plugin_command(spec: repos.RepoSpec, env: str = "") -> str:
    """The suite command with the generator's plugin loaded (and `env` assignments for it)."""
    return (WIDE + f"export PYTHONPATH={PLUGIN_DIR}:$PYTHONPATH {env}; "
            + repos.suite_command(spec).replace("python3 -m pytest ", "python3 -m pytest -p horizon_gen_plugin ", 1))


def install_plugin(sandbox) -> None:
    sandbox.exec(f"mkdir -p {PLUGIN_DIR}", timeout=30.0, workdir="/")
    sandbox.write_file(f"{PLUGIN_DIR}/horizon_gen_plugin.py", PLUGIN_SOURCE)


def coverage_map(spec: repos.RepoSpec, baseline: dict, *, root=None, force: bool = False) -> dict:
    """{"path:first line": [stable test ids that ran that function]} for the mutable modules,
    from one traced suite run in the repository image; cached in ``coverage.json`` beside the
    baseline, keyed by the image labels. `tests_for` turns it into a mutation's relevant tests."""
    path = repos.repo_dir(spec, root) / "coverage.json"
    if not force and path.is_file():
        old = json.loads(path.read_text())
        if old.get("labels") == baseline["labels"] and old.get("format") == GEN_FORMAT:
            return old
    with open_sandbox("docker", spec.image, default_timeout=600.0, **repos.SANDBOX_LIMITS) as sb:
        install_plugin(sb)
        t0 = time.monotonic()
        r = sb.exec(plugin_command(spec, f"HORIZON_COVERAGE_OUT={COVERAGE_PATH}"), timeout=1800.0, workdir=WORKSPACE)
        try:
            per_test = json.loads(sb.read_file(COVERAGE_PATH))
        except (FileNotFoundError, json.JSONDecodeError) as e:
            raise TaskError(f"{spec.key}: the traced suite run wrote no coverage ({e}): {r.output[-300:]!r}") from e
        seconds = time.monotonic() - t0
    stable = set(baseline["stable"])
    funcs: dict[str, list[str]] = {}
    for t, keys in per_test.items():
        if t in stable:
            for k in keys:
                funcs.setdefault(k, []).append(t)
    out = {"labels": baseline["labels"], "format": GEN_FORMAT, "traced_s": round(seconds, 2),
           "untraced": sorted(stable - set(per_test)), "functions": {k: sorted(v) for k, v in sorted(funcs.items())}}
    path.write_text(json.dumps(out) + "\n")
    return out


def tests_for(cov: dict | None, baseline: dict, m: mutate.Mutation) -> list[str]:
    """The stable tests that can observe mutation `m` (all of them without a coverage map): those
    that ran a function `m` changes (its innermost enclosing function at each changed line;
    module- or class-level code runs at import, so every test), plus any test the trace missed.
    Empty = no test runs the mutated code (the candidate is rejected unrun, "uncovered")."""
    stable = list(baseline["stable"])
    if cov is None:
        return stable
    lines = sorted({ln for i1, i2, _ in mutate.changed_lines(m) for ln in range(i1 + 1, max(i1 + 1, i2) + 1)})
    got = set(cov.get("untraced", ()))
    for ln in lines or [m.line]:
        key = mutate.function_key(m.original, ln)
        if key is None:
            return stable
        got.update(cov["functions"].get(f"{m.path}:{key[1]}", ()))
    return [t for t in stable if t in got]


def validate_one(sandbox, spec, baseline, m: mutate.Mutation, tests=None) -> Verdict:
    """Run the stable `tests` (default: the whole suite) with `m` applied in `sandbox` (the
    repository image, plugin installed), then restore the tree (one exec runs and restores)."""
    stable = list(baseline["stable"]) if tests is None else list(tests)
    sandbox.write_file(f"{WORKSPACE}/{m.path}", m.source)
    env = ""
    if tests is not None and len(stable) < len(baseline["stable"]):
        sandbox.write_file(SELECT_PATH, "\n".join(stable) + "\n")
        env = f"HORIZON_SELECT={SELECT_PATH}"
    restore = "git checkout -q -- . && git clean -fdq"
    statuses, report, timed_out = repos.run_suite(sandbox, plugin_command(spec, env) + "; " + restore,
                                                  suite_timeout(baseline, len(stable)))
    if timed_out or not sandbox.alive():
        if not sandbox.alive():
            raise TaskError(f"{spec.image}: the validation container died")
        sandbox.prepare()   # ends what the timed-out run left behind (and clears /tmp: the plugin too)
        r = sandbox.exec(restore, timeout=60.0, workdir=WORKSPACE)
        if not r.ok:
            raise TaskError(f"{spec.image}: restoring the tree failed: {r.output[-300:]}")
        install_plugin(sandbox)
    if not statuses and not timed_out and not sandbox.exec(f"test -f {PLUGIN_DIR}/horizon_gen_plugin.py", timeout=30.0,
                                                          workdir="/").ok:
        raise TaskError(f"{spec.image}: the generator's pytest plugin is gone from the container")
    v = verdict(statuses, stable, timed_out, failure_messages(report))
    if v.status == "kept" and len(stable) < len(baseline["stable"]):
        # the stable tests not run never call the mutated code (`tests_for`): they pass as at baseline
        f2p = set(v.fail_to_pass)
        v = dataclasses.replace(v, pass_to_pass=tuple(t for t in baseline["stable"] if t not in f2p))
    return v


def validate_many(spec, baseline, jobs, *, workers: int = 1, log=None, t0: float | None = None) -> list[Verdict]:
    """Verdicts of `jobs` [(mutation, tests)] in order, validated by a pool of `workers` threads,
    each with its own container of the repository image (opened on its first job)."""
    local, boxes, lock = threading.local(), [], threading.Lock()
    done = [0]
    t0 = time.monotonic() if t0 is None else t0

    def run(job):
        m, tests = job
        sb = getattr(local, "sb", None)
        if sb is None:
            sb = local.sb = open_sandbox("docker", spec.image, default_timeout=600.0, **repos.SANDBOX_LIMITS)
            with lock:
                boxes.append(sb)
            install_plugin(sb)
        v = validate_one(sb, spec, baseline, m, tests)
        with lock:
            done[0] += 1
            if log and done[0] % 25 == 0:
                log(f"[generate {spec.name}] validated {done[0]}/{len(jobs)} ({time.monotonic() - t0:.0f}s)")
        return v
    try:
        with ThreadPoolExecutor(max(1, min(int(workers), len(jobs) or 1))) as ex:
            return list(ex.map(run, jobs))
    finally:
        for sb in boxes:
            sb.close()


def instance_labels(inst_id: str, base_commit: str, base_id: str) -> dict[str, str]:
    """Labels of an instance image (its content is fixed by the commit and the base image)."""
    h = hashlib.sha256(f"{GEN_FORMAT}\0{inst_id}\0{base_commit}\0{base_id}".encode()).hexdigest()
    return {PROJECT_LABEL: "swe-image", LABEL_INSTANCE: inst_id, LABEL_INSTANCE_HASH: h}


def bug_commit(repo_src: str | os.PathLike, m: mutate.Mutation, dest: str | os.PathLike) -> str:
    """`dest` := the repository's files with `m` applied, as a fresh one-commit git repo; its sha."""
    shutil.copytree(repo_src, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    (pathlib.Path(dest) / m.path).write_text(m.source, encoding="utf-8")
    return repos.git_commit_all(dest, "base")


def build_instance(spec, m, key, repo_src, *, base_image=DEFAULT_BASE_IMAGE, client=None,
                   extra_labels: dict | None = None, image_repo: str = INSTANCE_IMAGE_REPO) -> tuple[str, str, str]:
    """(tag, base_commit, "built" | "skipped") of the instance image of a kept candidate."""
    client = repos.docker_client(client)
    tag = f"{image_repo}:{swebench.task_id_for(instance_id(spec, m, key))}"
    with tempfile.TemporaryDirectory(prefix="horizon-swegen-") as tmp:
        src = pathlib.Path(tmp) / "repo"
        base_commit = bug_commit(repo_src, m, src)
        labels = {**instance_labels(instance_id(spec, m, key), base_commit, client.images.get(base_image).id),
                  **(extra_labels or {})}
        if repos.image_labels_current(client, tag, labels):
            return tag, base_commit, "skipped"
        repos.build_image(client, src, tag, labels, base_image)
    return tag, base_commit, "built"


@dataclasses.dataclass(frozen=True)
class GenOptions:
    """What `generate_repo` makes of one repository (configs/swegen.py `gen`; module docstring)."""
    n_candidates: int                 # single-site mutations (mutate.KINDS) validated
    n_features: int = 0               # feature deletions (mutate.FEATURE_KIND) validated
    n_combined: int = 0               # combinations of kept single-site bugs of one module (mutate.COMBINED_KIND)
    combine_size: int = 2             # bugs per combination
    seed: int = 0
    max_instances: int = 0            # 0 = every kept candidate becomes an instance
    workers: int = 1                  # validation containers (threads) per repository; image builds too
    select_tests: bool = True         # run only the tests that ran the mutated code (coverage map)


def _combinations(kept: list[mutate.Mutation], n: int, size: int, seed: int) -> list[mutate.Mutation]:
    """Up to `n` distinct `mutate.combine`s of `size` kept single-site bugs of one module, seeded."""
    rng = random.Random(seed)
    by_path: dict[str, list[mutate.Mutation]] = {}
    for m in kept:
        if m.kind in mutate.KINDS:
            by_path.setdefault(m.path, []).append(m)
    pools = [ms for _, ms in sorted(by_path.items()) if len(ms) >= size]
    out, seen, tries = [], set(), 0
    while pools and len(out) < n and tries < 20 * max(n, 1):
        tries += 1
        ms = rng.choice(pools)
        try:
            c = mutate.combine(sorted(rng.sample(ms, size), key=lambda m: m.line))
        except mutate.MutationError:
            continue
        if c.source not in seen:
            seen.add(c.source)
            out.append(c)
    return out


def generate_repo(spec: repos.RepoSpec, baseline: dict, *, n_candidates: int = 0, seed: int = 0,
                  max_instances: int = 0, options: GenOptions | None = None, root=None,
                  base_image: str = DEFAULT_BASE_IMAGE, client=None, build_images: bool = True,
                  extra_labels: dict | None = None, image_repo: str = INSTANCE_IMAGE_REPO, split: str | None = None,
                  log=print) -> tuple[list[swebench.SweInstance], dict]:
    """(instances, report) for one repository (module docstring). `options` (else `n_candidates`,
    `seed`, `max_instances` with the defaults of `GenOptions`); `root`: the build directory
    (`repos.BUILD_ROOT`); instance images are tagged `image_repo`:<task id>; `split` is written on
    every instance."""
    o = options or GenOptions(n_candidates=n_candidates, seed=seed, max_instances=max_instances)
    t0 = time.monotonic()
    repo_src = repos.prepare_repo(spec, root)
    files, _ = swebench.repo_tree(repo_src, "HEAD")
    tree = baseline["labels"][repos.LABEL_TREE]
    cov = coverage_map(spec, baseline, root=root) if o.select_tests else None
    paths = repos.source_files(files, spec)
    timing = {"coverage_s": round(time.monotonic() - t0, 1)}

    def covered(ms, n):
        out, skipped = [], 0
        for m in ms:
            if len(out) >= n:
                break
            tests = tests_for(cov, baseline, m)
            if tests:
                out.append((m, tests))
            else:
                skipped += 1
        return out, skipped

    pool = candidate_mutations(files, paths, 3 * o.n_candidates, o.seed) if o.n_candidates else []
    singles, uncovered = covered(pool, o.n_candidates)
    feats = []
    if o.n_features:
        fpool = [m for p in paths for m in _safe(mutate.feature_deletions, files[p], p)]
        random.Random(o.seed + 1).shuffle(fpool)
        feats, u2 = covered(fpool, o.n_features)
        uncovered += u2
    verdicts, counts = [], {"cached": 0, "validated": 0}
    t1 = time.monotonic()

    def validate(jobs):
        keyed = [(m, candidate_key(tree, m), tests) for m, tests in jobs]
        got = {k: load_cached(root, spec, k) for _, k, _ in keyed}
        todo = [(m, tests) for m, k, tests in keyed if got[k] is None]
        for (m, tests), v in zip(todo, validate_many(spec, baseline, todo, workers=o.workers, log=log, t0=t0)):
            k = candidate_key(tree, m)
            store_cached(root, spec, k, v)
            got[k] = v
        counts["cached"] += len(keyed) - len(todo)
        counts["validated"] += len(todo)
        return [(m, k, got[k]) for m, k, _ in keyed]

    verdicts += validate(singles + feats)
    if o.n_combined:
        kept_singles = [m for m, _, v in verdicts if v.status == "kept" and m.kind in mutate.KINDS]
        combos = _combinations(kept_singles, o.n_combined, o.combine_size, o.seed + 2)
        verdicts += validate([(m, tests_for(cov, baseline, m)) for m in combos])
    timing["validate_s"] = round(time.monotonic() - t1, 1)
    kept = [(m, k, v) for m, k, v in verdicts if v.status == "kept"]
    if o.max_instances:     # round-robin over single-site bugs, deleted features and combinations
        groups = [[x for x in kept if (x[0].kind if x[0].kind in mutate.EXTRA_KINDS else "single") == g]
                  for g in ("single", *mutate.EXTRA_KINDS)]
        kept = [x for tier in itertools.zip_longest(*groups) for x in tier if x is not None][:o.max_instances]
    t2 = time.monotonic()

    def build(item):
        m, key, v = item
        if build_images:
            tag, commit, what = build_instance(spec, m, key, repo_src, base_image=base_image, client=client,
                                               extra_labels=extra_labels, image_repo=image_repo)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                tag, commit, what = None, bug_commit(repo_src, m, pathlib.Path(tmp) / "repo"), "none"
        return make_instance(spec, m, v, key, commit, tag, split), what == "built"
    with ThreadPoolExecutor(max(1, int(o.workers))) as ex:
        built_list = list(ex.map(build, kept))
    instances = [i for i, _ in built_list]
    timing["images_s"] = round(time.monotonic() - t2, 1)
    report = repo_report(spec, verdicts, instances, cached=counts["cached"], images_built=sum(b for _, b in built_list),
                         seconds=time.monotonic() - t0)
    report.update(uncovered_skipped=uncovered, split=split, **timing)
    if counts["validated"]:
        report["candidates_per_min"] = round(60.0 * counts["validated"] / max(timing["validate_s"], 1e-6), 1)
    return instances, report


def _safe(fn, *args):
    try:
        return fn(*args)
    except mutate.MutationError:
        return []


def repo_report(spec, verdicts, instances, *, cached: int, images_built: int, seconds: float) -> dict:
    """The per-repository report: candidates, cached, kept, rejected by reason, kinds tried / kept."""
    def count(items):
        out = {}
        for k in items:
            out[k] = out.get(k, 0) + 1
        return dict(sorted(out.items()))
    return {"repo": spec.repo, "version": spec.version, "candidates": len(verdicts), "cached": cached,
            "validated": len(verdicts) - cached, "kept": sum(v.status == "kept" for _, _, v in verdicts),
            "instances": len(instances), "images_built": images_built,
            "rejected": count(v.status for _, _, v in verdicts if v.status != "kept"),
            "kinds_tried": count(m.kind for m, _, _ in verdicts),
            "kinds_kept": count(i.extra["metadata"]["kind"] for i in instances), "seconds": round(seconds, 1)}


def set_report(reports: list[dict], splits: dict[str, list], *, seconds: float) -> dict:
    """The whole set's report: per-repository reports, instances per split, per kind and per repository."""
    kinds: dict[str, int] = {}
    for r in reports:
        for k, n in r["kinds_kept"].items():
            kinds[k] = kinds.get(k, 0) + n
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
