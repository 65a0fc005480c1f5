"""Real repositories for the task generator: manifest, repository images, the screened baseline
(docs/SPEC.md §5, §7).

`envs/repos/manifest.toml` lists small pure-Python projects whose sdists ship their test suites
(name, version, sdist file, sha256, pytest paths `tests`, mutable `sources`). For each one:

1. `fetch_sdist`: ``pip download --no-deps --no-binary :all: NAME==VERSION`` on the host (the
   package index works there, not in containers), checked against the pinned sha256.
2. `prepare_repo`: the sdist unpacked into a host directory, a ``pytest.ini`` written at its root
   (``[pytest] pythonpath = src .``: replaces the project's own pytest options, e.g. ``--cov``
   addopts the image cannot honour, and makes ``src/`` layouts importable), committed as a git
   repository with a fixed identity and date, so its tree hash is the content hash.
3. `build_repo_image`: ``horizon-repo:NAME-VERSION`` = the base image + that repository (with its
   .git) in /workspace, ``PYTHONPATH`` and ``PYTHONDONTWRITEBYTECODE=1`` (a mutated module is
   never shadowed by a stale .pyc), labelled with the tree hash and the base image id; skipped
   when current (the labels match).
4. `screen_suite`: the suite runs twice in the image (pytest ``-rA`` per-test report, the command
   `swebench.grade` runs); a test that does not pass in both runs is flaky and excluded; the
   tests passing both times are the PASS_TO_PASS candidates. Stored as ``baseline.json`` beside
   the repository, keyed by the image labels (skipped when current).

Everything here imports only horizon.sandbox and horizon.tasks (nothing above tasks/).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib

from horizon.sandbox.base import DEFAULT_BASE_IMAGE, PROJECT_LABEL, WORKSPACE
from horizon.sandbox.factory import open_sandbox
from horizon.tasks import swebench
from horizon.tasks.task import TaskError

REPO_FORMAT = "1"                 # bump when the repository/image layout changes (forces rebuilds)
MANIFEST_PATH = pathlib.Path(__file__).resolve().parents[3] / "envs" / "repos" / "manifest.toml"
BUILD_ROOT = pathlib.Path(__file__).resolve().parents[3] / "envs" / ".build" / "repos"
LABEL_REPO = PROJECT_LABEL + ".repo"
LABEL_TREE = PROJECT_LABEL + ".repo_tree"
LABEL_BASE = PROJECT_LABEL + ".repo_base"
LABEL_FORMAT = PROJECT_LABEL + ".repo_format"
GIT_ENV = {"GIT_AUTHOR_NAME": "horizon", "GIT_AUTHOR_EMAIL": "horizon@localhost", "GIT_COMMITTER_NAME": "horizon",
           "GIT_COMMITTER_EMAIL": "horizon@localhost", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
SANDBOX_LIMITS = {"cpus": 1.0, "mem_limit": "2g", "pids_limit": 512}
MIN_SUITE_TIMEOUT_S = 120.0
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_TEST_FILE_RE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py)$")
_TEST_DIR_RE = re.compile(r"(^|/)(tests?|testing)/")


@dataclasses.dataclass(frozen=True)
class RepoSpec:
    """One manifest entry."""
    name: str
    version: str
    sdist: str
    sha256: str
    tests: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def repo(self) -> str:
        """The SWE-bench ``repo`` field of this project's instances."""
        return f"pypi/{self.name}"

    @property
    def image(self) -> str:
        return f"horizon-repo:{self.key}"


def parse_spec(entry, where: str = "manifest") -> RepoSpec:
    """A `RepoSpec` from one decoded manifest table; `TaskError` (one line) on a bad field."""
    if not isinstance(entry, dict):
        raise TaskError(f"{where}: a [[repo]] entry must be a table")
    for k in ("name", "version", "sdist", "sha256"):
        if not isinstance(entry.get(k), str) or not entry[k]:
            raise TaskError(f"{where}: {k} must be a non-empty string")
    where = f"{where} ({entry['name']})"
    if not _NAME_RE.match(entry["name"]):
        raise TaskError(f"{where}: name must match {_NAME_RE.pattern}")
    if not _SHA_RE.match(entry["sha256"]):
        raise TaskError(f"{where}: sha256 must be 64 lowercase hex digits")
    for k in ("tests", "sources"):
        v = entry.get(k)
        if not isinstance(v, list) or not v or not all(isinstance(p, str) and p and not p.startswith("/") for p in v):
            raise TaskError(f"{where}: {k} must be a non-empty list of relative paths")
    unknown = sorted(set(entry) - {"name", "version", "sdist", "sha256", "tests", "sources"})
    if unknown:
        raise TaskError(f"{where}: unknown field(s) {unknown}")
    return RepoSpec(entry["name"], entry["version"], entry["sdist"], entry["sha256"], tuple(entry["tests"]),
                    tuple(entry["sources"]))


def load_manifest(path: str | os.PathLike | None = None) -> list[RepoSpec]:
    """Every repository of the manifest (default `MANIFEST_PATH`), names unique."""
    path = pathlib.Path(path or MANIFEST_PATH)
    if not path.is_file():
        raise TaskError(f"{path}: no such repository manifest")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{path}: malformed TOML ({e})") from e
    specs = [parse_spec(e, f"{path}: repo {i}") for i, e in enumerate(data.get("repo", []), 1)]
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TaskError(f"{path}: duplicate repository name(s) {dup}")
    return specs


def manifest_heldout(path: str | os.PathLike | None = None) -> list[str]:
    """The manifest's top-level ``heldout`` list: repositories whose instances form the held-out
    split (no train instance comes from them); names must be in the manifest."""
    path = pathlib.Path(path or MANIFEST_PATH)
    specs = load_manifest(path)
    names = tomllib.loads(path.read_text(encoding="utf-8")).get("heldout", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TaskError(f"{path}: heldout must be a list of repository names")
    select(specs, names)
    return list(names)


def select(specs: list[RepoSpec], names) -> list[RepoSpec]:
    """The specs named (all when `names` is empty), in manifest order; `TaskError` on an unknown name."""
    names = list(names or [])
    unknown = sorted(set(names) - {s.name for s in specs})
    if unknown:
        raise TaskError(f"unknown repository name(s) {unknown}; known: {[s.name for s in specs]}")
    return [s for s in specs if not names or s.name in names]


def is_test_path(path: str) -> bool:
    """Whether `path` is test code (test_*.py, *_test.py, conftest.py, or under tests/ / test/)."""
    return bool(_TEST_FILE_RE.search(path) or _TEST_DIR_RE.search(path))


def source_files(paths, spec: RepoSpec) -> list[str]:
    """The mutable modules among `paths`: .py files under (or equal to) one of `spec.sources`,
    test code excluded; sorted."""
    def under(p):
        return any(p == s or p.startswith(s.rstrip("/") + "/") for s in spec.sources)
    return sorted(p for p in paths if p.endswith(".py") and under(p) and not is_test_path(p))


def pytest_ini(has_src: bool) -> str:
    """The ``pytest.ini`` every repository image gets at /workspace (module docstring, step 2)."""
    return "[pytest]\npythonpath = " + ("src ." if has_src else ".") + "\n"


def repo_dir(spec: RepoSpec, root: str | os.PathLike | None = None) -> pathlib.Path:
    """The host directory of `spec`'s build state (sdist-derived repo/, baseline.json, cache/)."""
    return pathlib.Path(root or BUILD_ROOT) / spec.key


def suite_command(spec: RepoSpec) -> str:
    """The suite's command: `swebench.pytest_command` over the manifest's test paths."""
    return swebench.pytest_command(list(spec.tests))


def repo_labels(spec: RepoSpec, tree: str, base_id: str) -> dict[str, str]:
    """Labels of a repository image: which repository, its git tree hash, the base image id."""
    return {PROJECT_LABEL: "repo-image", LABEL_REPO: spec.key, LABEL_TREE: tree, LABEL_BASE: base_id,
            LABEL_FORMAT: REPO_FORMAT}


def image_dockerfile(base_image: str, labels: dict[str, str], has_src: bool) -> str:
    """Dockerfile of a repository or instance image: base + repo/ (with .git) in /workspace."""
    label_args = " ".join(f'"{k}"="{v}"' for k, v in sorted(labels.items()))
    pypath = f"{WORKSPACE}/src:{WORKSPACE}" if has_src else WORKSPACE
    return (f"FROM {base_image}\nENV PYTHONPATH={pypath} PYTHONDONTWRITEBYTECODE=1\n"
            f"COPY --chown=1000:1000 repo/ {WORKSPACE}/\nLABEL {label_args}\n")


def screen(runs: list[dict[str, str]]) -> tuple[list[str], list[str]]:
    """(stable, flaky) from per-run test statuses: stable = passing (PASSED/XFAIL) in every run;
    flaky = reported in some run but not passing in all. Both sorted."""
    if not runs:
        raise TaskError("screen needs at least one suite run")
    seen = set().union(*runs)
    stable = sorted(t for t in seen if all(r.get(t) in swebench.PASS_STATUSES for r in runs))
    return stable, sorted(seen - set(stable))


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_commit_all(path: str | os.PathLike, message: str = "base") -> str:
    """``git init`` + commit everything in `path` with a fixed identity and date; the commit sha."""
    env = {**os.environ, **GIT_ENV}

    def git(*args):
        return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True,
                              env=env).stdout.strip()
    try:
        git("init", "-q", "-b", "main")
        git("add", "-A", "-f")
        git("commit", "-q", "--no-gpg-sign", "-m", message)
        return git("rev-parse", "HEAD")
    except subprocess.CalledProcessError as e:
        raise TaskError(f"{path}: git {e.cmd[3]} failed: {e.stderr.strip()}") from e


def git_tree(path: str | os.PathLike) -> str:
    """The tree hash of HEAD in git repository `path` (the repository's content hash)."""
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD^{tree}"], check=True, capture_output=True,
                              text=True).stdout.strip()
    except subprocess.CalledProcessError as e:
        raise TaskError(f"{path}: not a committed git repository ({e.stderr.strip()})") from e


def fetch_sdist(spec: RepoSpec, root: str | os.PathLike | None = None) -> pathlib.Path:
    """The sdist of `spec` on the host (downloaded once with pip, sha256-checked every time)."""
    dest = pathlib.Path(root or BUILD_ROOT) / "sdists"
    path = dest / spec.sdist
    if not path.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
               f"{spec.name}=={spec.version}", "-d", str(dest)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode or not path.is_file():
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise TaskError(f"{spec.key}: pip download did not give {spec.sdist}: {tail}")
    got = sha256_file(path)
    if got != spec.sha256:
        raise TaskError(f"{path}: sha256 {got} does not match the manifest's {spec.sha256}")
    return path


def prepare_repo(spec: RepoSpec, root: str | os.PathLike | None = None) -> pathlib.Path:
    """The host git repository of `spec` (module docstring, step 2); rebuilt only when the sdist
    or `REPO_FORMAT` changed. Returns its path."""
    sdist = fetch_sdist(spec, root)
    out = repo_dir(spec, root) / "repo"
    stamp = f"{spec.sha256} {REPO_FORMAT}"
    marker = repo_dir(spec, root) / "repo.stamp"
    if out.is_dir() and marker.is_file() and marker.read_text() == stamp:
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tops = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        if len(tops) != 1:
            raise TaskError(f"{sdist}: expected one top-level directory, got {sorted(tops)[:5]}")
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tar.extractall(tmp, filter="data")
            for p in pathlib.Path(tmp, tops.pop()).iterdir():
                shutil.move(str(p), out / p.name)
    for p in spec.tests + spec.sources:
        if not (out / p).exists():
            raise TaskError(f"{spec.key}: manifest path {p!r} is not in the sdist")
    for p in list(out.glob("*.egg-info")) + [out / "PKG-INFO"]:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    (out / "pytest.ini").write_text(pytest_ini((out / "src").is_dir()))
    git_commit_all(out, f"{spec.name} {spec.version}")
    marker.write_text(stamp)
    return out


def docker_client(client=None):
    import docker  # noqa: PLC0415 - only image builds need the docker SDK

    return client or docker.from_env(timeout=600)


def image_labels_current(client, tag: str, want: dict[str, str]) -> bool:
    """Whether image `tag` exists with every label of `want`."""
    import docker.errors  # noqa: PLC0415

    try:
        have = client.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return False
    return all(have.get(k) == v for k, v in want.items())


def build_image(client, src: str | os.PathLike, tag: str, labels: dict[str, str], base_image: str) -> None:
    """Build `tag` from the git repository `src` (copied with its .git) over `base_image`; never pulls."""
    import docker.errors  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="horizon-repo-") as ctx:
        shutil.copytree(src, pathlib.Path(ctx) / "repo", symlinks=True)
        has_src = (pathlib.Path(src) / "src").is_dir()
        (pathlib.Path(ctx) / "Dockerfile").write_text(image_dockerfile(base_image, labels, has_src))
        try:
            client.images.build(path=ctx, tag=tag, pull=False, rm=True, forcerm=True)
        except docker.errors.BuildError as e:
            raise TaskError(f"building {tag} failed: {e}") from e


def build_repo_image(spec: RepoSpec, *, root=None, base_image: str = DEFAULT_BASE_IMAGE, client=None,
                     force: bool = False) -> tuple[str, dict[str, str]]:
    """("built" | "skipped", labels) for `spec.image` (module docstring, step 3)."""
    client = docker_client(client)
    src = prepare_repo(spec, root)
    labels = repo_labels(spec, git_tree(src), client.images.get(base_image).id)
    if not force and image_labels_current(client, spec.image, labels):
        return "skipped", labels
    build_image(client, src, spec.image, labels, base_image)
    return "built", labels


def run_suite(sandbox, command: str, timeout: float) -> tuple[dict[str, str], str, bool]:
    """(statuses, report text, timed_out) of one pytest run of `command` in `sandbox`."""
    r = sandbox.exec(command, timeout=timeout, workdir=WORKSPACE)
    try:
        report = sandbox.read_file(swebench.REPORT_PATH).decode("utf-8", errors="replace")
    except FileNotFoundError:
        report = ""
    return swebench.parse_test_report(report), report, r.timed_out


def screen_suite(spec: RepoSpec, labels: dict[str, str], *, root=None, runs: int = 2, force: bool = False) -> dict:
    """The baseline of `spec.image` (module docstring, step 4), cached in ``baseline.json``:
    {labels, stable, flaky, suite_s (slowest run), runs}."""
    path = repo_dir(spec, root) / "baseline.json"
    if not force and path.is_file():
        old = json.loads(path.read_text())
        if old.get("labels") == labels and old.get("runs") == runs:
            return old
    statuses, times = [], []
    with open_sandbox("docker", spec.image, default_timeout=600.0, **SANDBOX_LIMITS) as sb:
        for _ in range(runs):
            t0 = time.monotonic()
            got, report, timed_out = run_suite(sb, suite_command(spec), 600.0)
            times.append(time.monotonic() - t0)
            if timed_out or not got:
                raise TaskError(f"{spec.key}: the suite {'timed out' if timed_out else 'reported no tests'} "
                                f"in {spec.image}: {report[-300:]!r}")
            statuses.append(got)
    stable, flaky = screen(statuses)
    if not stable:
        raise TaskError(f"{spec.key}: no test passes in both runs")
    out = {"labels": labels, "runs": runs, "stable": stable, "flaky": flaky, "suite_s": round(max(times), 2)}
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out
