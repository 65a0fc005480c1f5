"""SWE-bench-format instances generated from real repositories by validated bug injection
(SPEC §5 sandboxes, §7 tasks; issue 26 item 2).

For one repository of `repos` (its image built and its baseline screened):

1. Candidates: `mutate.sample` over each mutable module (`repos.source_files`), a seeded number
   per file, duplicates (same path and mutated source) removed, `n_candidates` kept in a seeded
   order.
2. Validation in Docker (one container of the repository image per repository): the mutated module
   is written, the suite runs (the per-test report `swebench.grade` reads), the tree is restored
   (``git checkout`` + ``git clean``). Kept iff the run finished, at least one stable test
   (`repos.screen`) fails, and every other stable test passes (`verdict`; a test missing from the
   report, e.g. an import error at collection, rejects). FAIL_TO_PASS = the failing stable tests,
   PASS_TO_PASS = the passing ones; flaky tests are in neither.
3. Each verdict is cached under ``cache/<key>.json`` (`candidate_key`: sha256 of the repository's
   tree hash, the module path, the mutated source and `GEN_FORMAT`), so a rebuild only validates
   new candidates.
4. A kept candidate becomes an instance: image ``horizon-swegen:<task id>`` = the base image + the
   repository with the bug, committed as a fresh single-commit git repository (the clean code is
   not in its history; fixed identity and date, so ``base_commit`` is reproducible); ``patch`` =
   the mutation's gold patch (the inverse diff); ``test_patch`` empty (the tests already exist;
   `swebench.grade` restores the instance's test files from ``base_commit``);
   ``problem_statement`` from the failing tests' names and assertion messages (`problem_statement`,
   no language model). Images are skipped when current (labels).

`generate_repo` returns the instances and a report (candidates, cached, kept, rejected by reason,
kinds); `swebench.write_jsonl` writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import random
import re
import shutil
import tempfile
import time
import zlib

from horizon.sandbox.base import DEFAULT_BASE_IMAGE, PROJECT_LABEL, WORKSPACE
from horizon.tasks import mutate, repos, swebench
from horizon.tasks.task import TaskError

GEN_FORMAT = "2"                  # bump when validation or instance layout changes (invalidates the cache)
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


def problem_statement(spec: repos.RepoSpec, v: Verdict) -> str:
    """The issue text of a kept candidate: which tests fail and how (no location, no language model)."""
    n = len(v.fail_to_pass)
    lines = [f"Some of {spec.name}'s tests fail (version {spec.version} in /workspace).", "",
             f"{n} failing test{'s' if n != 1 else ''}:"]
    for t in v.fail_to_pass[:MAX_LISTED_FAILURES]:
        msg = v.messages.get(t, "")
        lines.append(f"- {t}" + (f": {msg}" if msg else ""))
    if n > MAX_LISTED_FAILURES:
        lines.append(f"- ... and {n - MAX_LISTED_FAILURES} more")
    lines += ["", "Fix the library code so that these tests pass and the rest of the test suite still "
              "passes. Do not change the tests."]
    return "\n".join(lines)


def instance_id(spec: repos.RepoSpec, m: mutate.Mutation, key: str) -> str:
    """SWE-bench-style id: ``<name>__<kind>-<key[:10]>``."""
    return f"{spec.name}__{m.kind}-{key[:10]}"


def make_instance(spec: repos.RepoSpec, m: mutate.Mutation, v: Verdict, key: str, base_commit: str,
                  image: str | None) -> swebench.SweInstance:
    """The `SweInstance` of a kept candidate (module docstring, step 4)."""
    if v.status != "kept":
        raise TaskError(f"{m.location}: candidate was not kept ({v.status})")
    extra = {"metadata": {"generator": "horizon.tasks.generate", "format": GEN_FORMAT, "kind": m.kind,
                          "file": m.path, "line": m.line, "function": m.function, "description": m.description,
                          "version": spec.version, "key": key}}
    return swebench.SweInstance(instance_id(spec, m, key), spec.repo, base_commit, m.gold_patch, "",
                                problem_statement(spec, v), v.fail_to_pass, v.pass_to_pass, image, None, extra)


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


def suite_timeout(baseline: dict) -> float:
    """Per-candidate suite timeout: 4x the slowest baseline run, at least 60 s (catches loops)."""
    return max(60.0, 4.0 * float(baseline["suite_s"]))


def validate_one(sandbox, spec, baseline, m: mutate.Mutation) -> Verdict:
    """Run the suite with `m` applied in `sandbox` (the repository image), then restore the tree."""
    sandbox.write_file(f"{WORKSPACE}/{m.path}", m.source)
    try:
        cmd = WIDE + repos.suite_command(spec)
        statuses, report, timed_out = repos.run_suite(sandbox, cmd, suite_timeout(baseline))
    finally:
        if not sandbox.alive():
            raise TaskError(f"{spec.image}: the validation container died")
        sandbox.prepare()   # ends what a timed-out run left behind
        r = sandbox.exec("git checkout -q -- . && git clean -fdq", timeout=60.0, workdir=WORKSPACE)
        if not r.ok:
            raise TaskError(f"{spec.image}: restoring the tree failed: {r.output[-300:]}")
    return verdict(statuses, baseline["stable"], timed_out, failure_messages(report))


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


def generate_repo(spec: repos.RepoSpec, baseline: dict, *, n_candidates: int, seed: int = 0, max_instances: int = 0,
                  root=None, base_image: str = DEFAULT_BASE_IMAGE, client=None, build_images: bool = True,
                  extra_labels: dict | None = None, image_repo: str = INSTANCE_IMAGE_REPO,
                  log=print) -> tuple[list[swebench.SweInstance], dict]:
    """(instances, report) for one repository (module docstring); `max_instances` 0 = all kept.
    `root`: the build directory (`repos.BUILD_ROOT`); instance images are tagged `image_repo`:<task id>."""
    from horizon.sandbox.factory import open_sandbox  # noqa: PLC0415

    t0 = time.monotonic()
    repo_src = repos.prepare_repo(spec, root)
    files, _ = swebench.repo_tree(repo_src, "HEAD")
    tree = baseline["labels"][repos.LABEL_TREE]
    cands = candidate_mutations(files, repos.source_files(files, spec), n_candidates, seed)
    verdicts, cached, sb = [], 0, None
    try:
        for i, m in enumerate(cands, 1):
            key = candidate_key(tree, m)
            v = load_cached(root, spec, key)
            if v is None:
                if sb is None:
                    sb = open_sandbox("docker", spec.image, default_timeout=600.0, **repos.SANDBOX_LIMITS)
                v = validate_one(sb, spec, baseline, m)
                store_cached(root, spec, key, v)
            else:
                cached += 1
            verdicts.append((m, key, v))
            if log and i % 25 == 0:
                log(f"[generate {spec.name}] {i}/{len(cands)} candidates ({time.monotonic() - t0:.0f}s)")
    finally:
        if sb is not None:
            sb.close()
    kept = [(m, k, v) for m, k, v in verdicts if v.status == "kept"]
    if max_instances:
        kept = kept[:max_instances]
    instances, built = [], 0
    for m, key, v in kept:
        if build_images:
            tag, commit, what = build_instance(spec, m, key, repo_src, base_image=base_image, client=client,
                                               extra_labels=extra_labels, image_repo=image_repo)
            built += what == "built"
        else:
            with tempfile.TemporaryDirectory() as tmp:
                tag, commit = None, bug_commit(repo_src, m, pathlib.Path(tmp) / "repo")
        instances.append(make_instance(spec, m, v, key, commit, tag))
    report = repo_report(spec, verdicts, instances, cached=cached, images_built=built, seconds=time.monotonic() - t0)
    return instances, report


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
