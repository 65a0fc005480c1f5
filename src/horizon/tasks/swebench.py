"""SWE-bench-format instances as horizon `Task`s, and their grading (docs/SPEC.md §5 sandboxes, §7 tasks/eval).

One JSONL row per instance with the fields SWE-bench, SWE-Gym, SWE-smith and SWE-rebench share:
``instance_id, repo, base_commit, patch, test_patch, problem_statement, FAIL_TO_PASS,
PASS_TO_PASS`` (the two lists JSON-encoded strings, or plain lists), optionally ``image`` (a
prepared image tag: the repository at ``base_commit`` in /workspace, with its .git) and ``split``.

The repository comes from either
- a local git repository on the host (`repo_paths[repo]`): the tree at ``base_commit`` becomes
  the task's files (UTF-8 text files; others are skipped and listed in the metadata), written
  into a base-image sandbox like any task; or
- a prepared image (`images[instance_id]`, `images[repo]` or the row's ``image``), opened as is.

Grading (reward_mode ``"swebench"``, `grade`): the instance's test files are restored (every
file the test_patch touches goes back to its base_commit content, or is removed if the patch
creates it; with an empty test_patch, as generated instances have, the files of the FAIL_TO_PASS
and PASS_TO_PASS tests), test_patch (if any) is applied over the agent's work, pytest runs the files named by
FAIL_TO_PASS and PASS_TO_PASS with a per-test report (``-rA``), and the reward is 1.0 iff every
FAIL_TO_PASS test and every PASS_TO_PASS test is reported PASSED (or XFAIL). The exit code is
not used. Sandbox failures propagate as `SandboxInfraError` (the caller's infra path, never 0).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import tarfile

from horizon.sandbox.base import DEFAULT_BASE_IMAGE, PROJECT_LABEL, WORKSPACE
from horizon.tasks.result import VerifyResult
from horizon.tasks.task import SPLITS, Task, TaskError

REWARD_MODE = "swebench"
REQUIRED_FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
                   "FAIL_TO_PASS", "PASS_TO_PASS")
OPTIONAL_FIELDS = ("image", "split", "hints_text", "created_at", "version", "environment_setup_commit",
                   "metadata")
PASS_STATUSES = ("PASSED", "XFAIL")
PATCH_PATH = "/tmp/horizon_swe.patch"
REPORT_PATH = "/tmp/horizon_swe_pytest.log"
DEFAULT_GRADE_TIMEOUT_S = 300.0
_REPORT_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+?)(?: - .*)?$")
_DIFF_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_PLUS_FILE_RE = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.M)
_MINUS_FILE_RE = re.compile(r"^--- (?:a/)?(\S+)", re.M)
_ID_BAD = re.compile(r"[^a-z0-9_.-]+")


@dataclasses.dataclass(frozen=True)
class SweInstance:
    """One parsed SWE-bench row (the two test lists decoded)."""
    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    image: str | None = None
    split: str | None = None
    extra: dict = dataclasses.field(default_factory=dict)


def _test_list(value, field: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: {field} is not a JSON-encoded list ({e})") from e
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise TaskError(f"{where}: {field} must be a list of test ids, got {value!r:.120}")
    return tuple(value)


def parse_instance(row, where: str = "instance") -> SweInstance:
    """A `SweInstance` from one decoded JSONL row; `TaskError` (one line) on a missing/bad field."""
    if not isinstance(row, dict):
        raise TaskError(f"{where}: a SWE-bench row must be a JSON object, got {type(row).__name__}")
    missing = [k for k in REQUIRED_FIELDS if k not in row]
    if missing:
        raise TaskError(f"{where}: missing field(s) {missing}")
    for k in ("instance_id", "repo", "base_commit", "patch", "problem_statement"):
        if not isinstance(row[k], str) or not row[k].strip():
            raise TaskError(f"{where}: {k} must be a non-empty string")
    if not isinstance(row["test_patch"], str):
        raise TaskError(f"{where}: test_patch must be a string (empty when the tests already exist)")
    where = f"{where} ({row['instance_id']})"
    f2p = _test_list(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
    p2p = _test_list(row["PASS_TO_PASS"], "PASS_TO_PASS", where)
    if not f2p:
        raise TaskError(f"{where}: FAIL_TO_PASS is empty (nothing to fix)")
    image = row.get("image")
    if image is not None and (not isinstance(image, str) or not image):
        raise TaskError(f"{where}: image must be a non-empty image tag")
    split = row.get("split")
    if split is not None and split not in SPLITS:
        raise TaskError(f"{where}: split {split!r} is not one of {SPLITS}")
    extra = {k: row[k] for k in row if k not in REQUIRED_FIELDS and k not in ("image", "split")}
    return SweInstance(row["instance_id"], row["repo"], row["base_commit"], row["patch"], row["test_patch"],
                       row["problem_statement"], f2p, p2p, image, split, extra)


def read_jsonl(path: str | os.PathLike) -> list[SweInstance]:
    """Every instance of a SWE-bench JSONL file; `TaskError` names the file and line of a bad row."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such SWE-bench JSONL file")
    out, seen = [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}:{n}: malformed JSON ({e})") from e
        inst = parse_instance(row, f"{path}:{n}")
        if inst.instance_id in seen:
            raise TaskError(f"{path}:{n}: duplicate instance_id {inst.instance_id!r}")
        seen.add(inst.instance_id)
        out.append(inst)
    return out


def instance_row(inst: SweInstance) -> dict:
    """The JSONL row of `inst` (lists JSON-encoded, as SWE-bench ships them)."""
    row = {"instance_id": inst.instance_id, "repo": inst.repo, "base_commit": inst.base_commit,
           "patch": inst.patch, "test_patch": inst.test_patch, "problem_statement": inst.problem_statement,
           "FAIL_TO_PASS": json.dumps(list(inst.fail_to_pass)), "PASS_TO_PASS": json.dumps(list(inst.pass_to_pass))}
    if inst.image:
        row["image"] = inst.image
    if inst.split:
        row["split"] = inst.split
    return {**row, **inst.extra}


def write_jsonl(instances, path: str | os.PathLike) -> None:
    """Write `instances` as SWE-bench JSONL (one row each, `instance_row`)."""
    text = "".join(json.dumps(instance_row(i), ensure_ascii=False) + "\n" for i in instances)
    pathlib.Path(path).write_text(text, encoding="utf-8")


def patch_files(patch: str) -> list[str]:
    """Paths a unified diff touches (new-side names; the old side for deletions), sorted."""
    paths = set()
    for _a, b in _DIFF_FILE_RE.findall(patch):
        paths.add(b)
    if not paths:   # plain `diff -u` output without git headers
        plus = [p for p in _PLUS_FILE_RE.findall(patch) if p != "/dev/null"]
        minus = [p for p in _MINUS_FILE_RE.findall(patch) if p != "/dev/null"]
        paths.update(plus or minus)
    return sorted(paths)


@dataclasses.dataclass(frozen=True)
class Hunk:
    """One hunk of a unified diff: `old` (its context and removed lines) becomes `new` (its context
    and added lines) in `path`; `old_start` is its first line in the file before the patch (the
    diff's ``-a``), `new_start` once the hunks before it in the same file are applied (``+c``)."""
    path: str
    new_start: int
    old: str
    new: str
    old_start: int = 0

    def context(self) -> tuple[int, int]:
        """(leading, trailing) lines the old and new text share: the hunk's unchanged context."""
        a, b = self.old.split("\n"), self.new.split("\n")
        pre = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        suf = next((i for i, (x, y) in enumerate(zip(a[::-1][:len(a) - pre], b[::-1][:len(b) - pre])) if x != y),
                   min(len(a), len(b)) - pre)
        return pre, suf

    def changed_lines(self) -> tuple[int, int]:
        """(first, last) line of the file before the patch that the hunk changes (its context
        aside; an insertion is the line before which it inserts)."""
        pre, suf = self.context()
        n = self.old.count("\n") + 1
        return self.old_start + pre, max(self.old_start + pre, self.old_start + n - 1 - suf)


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def patch_hunks(patch: str) -> list[Hunk]:
    """The hunks of a unified diff, in order. A hunk body is read by its header's line counts, so a
    removed line that itself starts with ``--`` is not mistaken for a file header."""
    hunks, path, lines, i = [], None, patch.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].removeprefix("b/")
            continue
        m = _HUNK_RE.match(line)
        if not m or path is None:
            continue
        n_old, n_new = int(m.group(2) or 1), int(m.group(4) or 1)
        old, new = [], []
        while i < len(lines) and (len(old) < n_old or len(new) < n_new):
            body = lines[i]
            i += 1
            tag, text = body[:1], body[1:]
            if tag in (" ", ""):
                old.append(text)
                new.append(text)
            elif tag == "-":
                old.append(text)
            elif tag == "+":
                new.append(text)
            # "\ No newline at end of file": not a line of either side
        hunks.append(Hunk(path, int(m.group(3)), "\n".join(old), "\n".join(new), int(m.group(1))))
    return hunks


def test_files(inst_or_lists) -> list[str]:
    """The test files pytest runs: the file part of every FAIL_TO_PASS / PASS_TO_PASS id."""
    ids = (inst_or_lists.fail_to_pass + inst_or_lists.pass_to_pass
           if isinstance(inst_or_lists, SweInstance) else tuple(inst_or_lists))
    return sorted({t.split("::", 1)[0] for t in ids})


def protected_files(inst: SweInstance) -> list[str]:
    """Files restored to ``base_commit`` before grading: those the test_patch touches, or, with an
    empty test_patch (generated instances: the failing tests already exist), the test files."""
    return patch_files(inst.test_patch) if inst.test_patch.strip() else test_files(inst)


def repo_tree(repo_path: str | os.PathLike, commit: str) -> tuple[dict[str, str], list[str]]:
    """(text files, skipped non-text paths) of `repo_path` at `commit` (``git archive``)."""
    repo_path = pathlib.Path(repo_path)
    if not (repo_path / ".git").exists() and not (repo_path / "HEAD").is_file():
        raise TaskError(f"{repo_path}: not a git repository")
    try:
        data = subprocess.run(["git", "-C", str(repo_path), "archive", "--format=tar", commit],
                              check=True, capture_output=True).stdout
    except subprocess.CalledProcessError as e:
        raise TaskError(f"{repo_path}: git archive {commit} failed: {e.stderr.decode(errors='replace').strip()}") from e
    files, skipped = {}, []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            if not m.isfile():
                if m.issym():
                    skipped.append(m.name)
                continue
            raw = tar.extractfile(m).read()
            try:
                files[m.name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped.append(m.name)
    return files, sorted(skipped)


def task_id_for(instance_id: str) -> str:
    """A valid horizon task id (docker-tag safe) for a SWE-bench instance id."""
    tid = _ID_BAD.sub("-", instance_id.lower()).strip("-_.")
    return tid[:128] or "instance"


def pytest_command(files: list[str]) -> str:
    """The grading command: pytest over `files` with a per-test report, output in REPORT_PATH."""
    args = " ".join(shlex.quote(f) for f in files)
    return (f"rm -f {REPORT_PATH}; python3 -m pytest -rA -p no:cacheprovider --color=no {args} > {REPORT_PATH} 2>&1; "
            f"echo \"[pytest exit $?]\"")


def instance_task(inst: SweInstance, *, repo_path: str | os.PathLike | None = None, image: str | None = None,
                  split: str | None = None) -> Task:
    """The horizon `Task` of `inst` (module docstring): files from `repo_path`, or the prepared `image`."""
    image = image or inst.image
    if repo_path is None and image is None:
        raise TaskError(f"instance {inst.instance_id}: no repository: give a local repo path for "
                        f"{inst.repo!r} or an image tag")
    files, skipped, originals = {}, [], None
    if repo_path is not None and image is None:
        files, skipped = repo_tree(repo_path, inst.base_commit)
        originals = {p: files.get(p) for p in protected_files(inst)}
    meta = {"source": f"swebench:{inst.instance_id}", "instance_id": inst.instance_id, "repo": inst.repo,
            "base_commit": inst.base_commit, "patch": inst.patch, "test_patch": inst.test_patch,
            "fail_to_pass": list(inst.fail_to_pass), "pass_to_pass": list(inst.pass_to_pass),
            "test_files": test_files(inst), "test_patch_files": protected_files(inst),
            "test_originals": originals, "skipped_files": skipped, "prepared_image": image is not None,
            "generator": dict(inst.extra.get("metadata") or {})}     # the task generator's kind, file, line
    return Task(id=task_id_for(inst.instance_id), prompt=inst.problem_statement, files=files,
                test_cmd=pytest_command(test_files(inst)), reward_mode=REWARD_MODE, image=image,
                kind="bugfix", split=split or inst.split or "train", metadata=meta)


def load_swebench(path: str | os.PathLike, *, repo_paths: dict | None = None, images: dict | None = None,
                  split: str | None = None) -> list[Task]:
    """Tasks of a SWE-bench JSONL file. Each instance's repository: `images[instance_id]`,
    `images[repo]`, the row's ``image``, else `repo_paths[repo]` (a local git repository)."""
    repo_paths, images = dict(repo_paths or {}), dict(images or {})
    tasks = []
    for inst in read_jsonl(path):
        image = images.get(inst.instance_id) or images.get(inst.repo) or inst.image
        repo = repo_paths.get(inst.repo)
        if image is None and repo is None:
            raise TaskError(f"{path}: instance {inst.instance_id}: repo {inst.repo!r} has no local path "
                            f"(repo_paths) and the instance no image")
        tasks.append(instance_task(inst, repo_path=repo, image=image, split=split))
    return tasks


def parse_test_report(output: str) -> dict[str, str]:
    """Test id -> status from pytest's ``-rA`` short summary (PASSED/FAILED/ERROR/XFAIL/XPASS).
    A test reported twice (e.g. passed, then an error in teardown) keeps its non-passing status."""
    out: dict[str, str] = {}
    for line in output.splitlines():
        m = _REPORT_RE.match(line.rstrip())
        if not m:
            continue
        status, test = m.groups()
        if out.get(test) in (None, *PASS_STATUSES):
            out[test] = status
    return out


def apply_patch(sandbox, patch: str, timeout: float = 60.0):
    """Apply unified diff `patch` in /workspace (``git apply``; works without a .git). Returns the
    `ExecResult`; sandbox failures raise `SandboxInfraError`."""
    sandbox.write_file(PATCH_PATH, patch if patch.endswith("\n") else patch + "\n")
    return sandbox.exec(f"git apply --whitespace=nowarn -v {PATCH_PATH}; rc=$?; rm -f {PATCH_PATH}; exit $rc",
                        timeout=timeout, workdir=WORKSPACE)


def _restore_test_files(task: Task, sandbox, timeout: float) -> None:
    md = task.metadata
    originals = md.get("test_originals")
    if originals is not None:
        gone = [p for p, c in originals.items() if c is None]
        for p, content in originals.items():
            if content is not None:
                sandbox.write_file(f"{WORKSPACE}/{p}", content)
        if gone:
            sandbox.exec("rm -f -- " + " ".join(shlex.quote(p) for p in gone), timeout=timeout, workdir=WORKSPACE)
        return
    base = shlex.quote(md["base_commit"])
    script = "; ".join(f"if git cat-file -e {base}:{shlex.quote(p)} 2>/dev/null; then git checkout -q {base} -- "
                       f"{shlex.quote(p)}; else rm -f -- {shlex.quote(p)}; fi" for p in md["test_patch_files"])
    if script:
        sandbox.exec(script, timeout=timeout, workdir=WORKSPACE)


def grade(task: Task, sandbox, timeout: float | None = None):
    """`VerifyResult` of a SWE-bench task's final sandbox state (module docstring). Raises
    `SandboxInfraError` when the sandbox fails; everything else the policy did is a score."""
    md = task.metadata
    timeout = timeout or DEFAULT_GRADE_TIMEOUT_S
    wanted = list(md["fail_to_pass"]) + list(md["pass_to_pass"])
    _restore_test_files(task, sandbox, timeout)
    r = apply_patch(sandbox, md["test_patch"], timeout=timeout) if md["test_patch"].strip() else None
    if r is not None and not r.ok:
        return VerifyResult(0.0, 0, len(wanted), f"[swebench] test_patch did not apply:\n{r.output[-2000:]}")
    r = sandbox.exec(task.test_cmd, timeout=timeout, workdir=WORKSPACE)
    try:
        report = sandbox.read_file(REPORT_PATH).decode("utf-8", errors="replace")
    except FileNotFoundError:
        report = ""
    if r.timed_out:
        return VerifyResult(0.0, 0, len(wanted), f"[swebench] tests timed out after {timeout}s\n{report[-4000:]}",
                            details=dict(timed_out=True))
    status = parse_test_report(report)
    bad = {t: status.get(t, "MISSING") for t in wanted if status.get(t) not in PASS_STATUSES}
    passed = len(wanted) - len(bad)
    f2p_bad = sorted(t for t in bad if t in md["fail_to_pass"])
    p2p_bad = sorted(t for t in bad if t not in md["fail_to_pass"])
    notes = [f"[swebench] {passed}/{len(wanted)} required tests pass",
             f"FAIL_TO_PASS not passing: {[(t, bad[t]) for t in f2p_bad]}",
             f"PASS_TO_PASS not passing: {[(t, bad[t]) for t in p2p_bad]}", report[-4000:]]
    return VerifyResult(float(not bad), passed, len(wanted), "\n".join(notes),
                        details=dict(f2p_failed=len(f2p_bad), p2p_failed=len(p2p_bad)))


def instance_dockerfile(base_image: str, labels: dict[str, str]) -> str:
    """Dockerfile of a prepared instance image: the base plus repo/ (with its .git) in /workspace."""
    label_args = " ".join(f'"{k}"="{v}"' for k, v in sorted(labels.items()))
    return f"FROM {base_image}\nCOPY --chown=1000:1000 repo/ {WORKSPACE}/\nLABEL {label_args}\n"


def build_instance_image(inst: SweInstance, repo_path: str | os.PathLike, tag: str, *, base_image: str | None = None,
                         client=None, labels: dict | None = None) -> str:
    """Build `tag`: `base_image` + a clone of `repo_path` checked out at ``base_commit`` in /workspace
    (the "prepared image" form of an instance; never pulls). Returns `tag`; `TaskError` on failure."""
    import tempfile  # noqa: PLC0415

    import docker  # noqa: PLC0415 - only the image build needs the docker SDK
    import docker.errors  # noqa: PLC0415

    client = client or docker.from_env(timeout=600)
    with tempfile.TemporaryDirectory(prefix="horizon-swe-") as ctx:
        repo = pathlib.Path(ctx) / "repo"
        try:
            subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(repo_path), str(repo)], check=True,
                           capture_output=True)
            subprocess.run(["git", "-C", str(repo), "checkout", "-q", inst.base_commit], check=True,
                           capture_output=True)
        except subprocess.CalledProcessError as e:
            raise TaskError(f"instance {inst.instance_id}: cloning {repo_path} at {inst.base_commit} failed: "
                            f"{e.stderr.decode(errors='replace').strip()}") from e
        all_labels = {PROJECT_LABEL: "swe-image", PROJECT_LABEL + ".instance_id": inst.instance_id, **(labels or {})}
        dockerfile = instance_dockerfile(base_image or DEFAULT_BASE_IMAGE, all_labels)
        (pathlib.Path(ctx) / "Dockerfile").write_text(dockerfile)
        try:
            client.images.build(path=ctx, tag=tag, pull=False, rm=True, forcerm=True)
        except docker.errors.BuildError as e:
            raise TaskError(f"building {tag} for {inst.instance_id} failed: {e}") from e
    return tag
