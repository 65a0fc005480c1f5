"""A kept candidate as a SWE-bench instance and its image (docs/SPEC.md §7; `generate` docstring,
step 4).

The image ``horizon-swegen:<task id>`` is the base image plus the repository with the bug,
committed as a fresh single-commit git repository (the clean code is not in its history; fixed
identity and date, so ``base_commit`` is reproducible). ``patch`` is the mutation's gold patch,
``test_patch`` is empty (the tests already exist), and the problem statement is written from the
failing tests alone (no language model).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tempfile

from horizon.sandbox.base import DEFAULT_BASE_IMAGE, PROJECT_LABEL
from horizon.taskgen import mutate, repos
from horizon.taskgen.verdicts import GEN_FORMAT, Verdict
from horizon.tasks import swebench
from horizon.tasks.task import TaskError

INSTANCE_IMAGE_REPO = "horizon-swegen"
LABEL_INSTANCE = PROJECT_LABEL + ".instance_id"
LABEL_INSTANCE_HASH = PROJECT_LABEL + ".instance_hash"
MAX_LISTED_FAILURES = 8


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
    """The `SweInstance` of a kept candidate."""
    if v.status != "kept":
        raise TaskError(f"{m.location}: candidate was not kept ({v.status})")
    extra = {"metadata": {"generator": "horizon.taskgen.generate", "format": GEN_FORMAT, "kind": m.kind,
                          "file": m.path, "line": m.line, "function": m.function, "description": m.description,
                          "version": spec.version, "key": key}}
    return swebench.SweInstance(instance_id(spec, m, key), spec.repo, base_commit, m.gold_patch, "",
                                problem_statement(spec, v, m), v.fail_to_pass, v.pass_to_pass, image, split, extra)


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

