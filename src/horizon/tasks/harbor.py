"""Harbor task directories as horizon `Task`s: import, image build, gold policy, grading
(docs/SPEC.md §5 sandboxes, §7 tasks/eval).

A Harbor (Terminal-Bench 2) task directory holds::

    task.toml               [verifier] timeout_sec, [agent] timeout_sec, [metadata], [environment]
    instruction.md          the prompt
    environment/Dockerfile  the task's image (build context: environment/)
    tests/test.sh           the verifier: writes a number to /logs/verifier/reward.txt
    solution/solve.sh       the oracle (optional): horizon's gold policy

No registry is reachable here, so every ``FROM`` image is mapped to a local image by
configuration (`from_map`: exact reference, then the reference without its tag, then ``"*"``);
an unmapped one is a one-line `TaskError`. The Dockerfile runs as root (as Harbor assumes), then
/tests, /solution, /logs and the WORKDIR are handed to the sandbox user (uid 1000), who runs the
agent's commands, the oracle and the verifier. Steps that need the network (``pip install``,
``apt-get``) cannot build here: their packages must come in through the build context.

Grading (reward_mode ``"harbor"``, `grade`): tests/ is copied to /tests (fresh), any old reward
file removed, ``bash /tests/test.sh`` runs in the WORKDIR under the verifier timeout, and the
reward is the number in /logs/verifier/reward.txt (missing or not a number: 0, with a note).
Sandbox failures propagate as `SandboxInfraError` (the caller's infra path, never 0).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shlex
import shutil
import tempfile
import tomllib

from horizon.sandbox.base import PROJECT_LABEL, WORKSPACE
from horizon.tasks.result import VerifyResult
from horizon.tasks.task import Task, TaskError

REWARD_MODE = "harbor"
IMAGE_REPO = "horizon-harbor"
REQUIRED_FILES = ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh")
REWARD_FILE = "/logs/verifier/reward.txt"
TESTS_DIR, SOLUTION_DIR = "/tests", "/solution"
LABEL_HASH = PROJECT_LABEL + ".harbor_hash"
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
_FROM_RE = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.I)
_AS_RE = re.compile(r"\s+AS\s+(\S+)", re.I)
_WORKDIR_RE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.I)
_ID_BAD = re.compile(r"[^a-z0-9_.-]+")


def map_from(ref: str, from_map: dict[str, str]) -> str | None:
    """The local image `from_map` gives for base reference `ref` (exact, untagged name, ``"*"``)."""
    if ref in from_map:
        return from_map[ref]
    name = ref.split("@", 1)[0].rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] or "@" in ref else ref
    return from_map.get(name, from_map.get("*"))


def rewrite_dockerfile(text: str, from_map: dict[str, str], where: str = "Dockerfile") -> tuple[str, str]:
    """(Dockerfile with local FROM images and the sandbox-user epilogue, final WORKDIR).
    `TaskError` (one line) when a FROM image has no mapping."""
    out, stages, workdir, user_set = [], set(), WORKSPACE, False
    for line in text.splitlines():
        if re.match(r"^\s*USER\s", line, re.I):
            user_set = True
        m = _FROM_RE.match(line)
        if m:
            head, flags, ref, rest = m.groups()
            if ref not in stages:
                local = map_from(ref, from_map)
                if local is None:
                    raise TaskError(f"{where}: FROM {ref} is not mapped to a local image "
                                    f"(configure from_map; known: {sorted(from_map)})")
                ref = local
            alias = _AS_RE.search(rest)
            if alias:
                stages.add(alias.group(1))
            out += [f"{head}{flags}{ref}{rest}", "USER root"]
            workdir, user_set = WORKSPACE, False
            continue
        w = _WORKDIR_RE.match(line)
        if w and w.group(1).startswith("/"):
            workdir = w.group(1)
        out.append(line)
    if not stages and not any(_FROM_RE.match(ln) for ln in text.splitlines()):
        raise TaskError(f"{where}: no FROM line")
    dirs = " ".join(shlex.quote(d) for d in (TESTS_DIR, SOLUTION_DIR, "/logs/verifier", "/logs/agent", workdir))
    own = " ".join(shlex.quote(d) for d in (TESTS_DIR, SOLUTION_DIR, "/logs", workdir))
    # few instructions: each one costs an intermediate container with the classic builder
    out += ["USER root"] * user_set + [f"RUN mkdir -p {dirs} && chown -R 1000:1000 {own}", "USER 1000:1000"]
    return "\n".join(out) + "\n", workdir


def _read_text_tree(root: pathlib.Path, where: str) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            try:
                out[p.relative_to(root).as_posix()] = p.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise TaskError(f"{where}: {p} is not UTF-8 text ({e.reason})") from e
    return out


def _tree_hash(root: pathlib.Path, dockerfile: str) -> str:
    h = hashlib.sha256(dockerfile.encode())
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "Dockerfile":
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def task_id_for(name: str) -> str:
    """A valid horizon task id (docker-tag safe) for a Harbor directory name."""
    return (_ID_BAD.sub("-", name.lower()).strip("-_.") or "task")[:128]


def load_harbor_dir(task_dir: str | os.PathLike, from_map: dict[str, str], *, split: str = "train",
                    kind: str = "feature") -> Task:
    """The `Task` of one Harbor directory (module docstring); `TaskError` names a missing file,
    a bad task.toml or an unmapped FROM image. The image is `horizon-harbor:<id>` (`build_image`)."""
    task_dir = pathlib.Path(task_dir)
    if not task_dir.is_dir():
        raise TaskError(f"{task_dir}: not a Harbor task directory")
    for rel in REQUIRED_FILES:
        if not (task_dir / rel).is_file():
            raise TaskError(f"{task_dir}: missing {rel}")
    try:
        toml = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{task_dir / 'task.toml'}: invalid TOML ({e})") from e
    try:
        verifier_timeout = float(toml.get("verifier", {}).get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S))
    except (TypeError, ValueError) as e:
        raise TaskError(f"{task_dir / 'task.toml'}: verifier.timeout_sec must be a number") from e
    prompt = (task_dir / "instruction.md").read_text(encoding="utf-8").strip()
    if not prompt:
        raise TaskError(f"{task_dir / 'instruction.md'}: empty instruction")
    env_dir = task_dir / "environment"
    dockerfile, workdir = rewrite_dockerfile((env_dir / "Dockerfile").read_text(encoding="utf-8"), from_map,
                                             str(env_dir / "Dockerfile"))
    if workdir != WORKSPACE:
        prompt += f"\n\n(Your working directory is {workdir}.)"
    sol_dir = task_dir / "solution"
    solution = _read_text_tree(sol_dir, str(task_dir)) if (sol_dir / "solve.sh").is_file() else {}
    tid = task_id_for(task_dir.name)
    meta = {"source": str(task_dir), "prepared_image": True, "harbor_dir": str(task_dir),
            "dockerfile": dockerfile, "workdir": workdir, "image_hash": _tree_hash(env_dir, dockerfile),
            "tests": _read_text_tree(task_dir / "tests", str(task_dir)), "solution": solution,
            "verifier_timeout_s": verifier_timeout, "toml": toml}
    return Task(id=tid, prompt=prompt, files={}, test_cmd=f"bash {TESTS_DIR}/test.sh", reward_mode=REWARD_MODE,
                image=f"{IMAGE_REPO}:{tid}", kind=kind, split=split, metadata=meta)


def load_harbor_tasks(root: str | os.PathLike, from_map: dict[str, str], *, split: str = "train") -> list[Task]:
    """Every Harbor task directory (one holding task.toml) directly under `root`, sorted by name."""
    root = pathlib.Path(root)
    if not root.is_dir():
        raise TaskError(f"Harbor task root {root} is not a directory")
    return [load_harbor_dir(d, from_map, split=split) for d in sorted(root.iterdir()) if (d / "task.toml").is_file()]


def build_image(task: Task, client=None, *, force: bool = False, timeout_s: int = 600) -> str:
    """Build `task.image` from its environment/ (FROM mapped; never pulls); "built" or "skipped"
    when an image with the same content hash exists. `TaskError` (one line) if the build fails."""
    import docker  # noqa: PLC0415 - only the image build needs the docker SDK
    import docker.errors  # noqa: PLC0415

    client = client or docker.from_env(timeout=timeout_s)
    want = task.metadata["image_hash"]
    if not force:
        try:
            if (client.images.get(task.image).labels or {}).get(LABEL_HASH) == want:
                return "skipped"
        except docker.errors.ImageNotFound:
            pass
    labels = {PROJECT_LABEL: "harbor-image", LABEL_HASH: want}
    label_line = "LABEL " + " ".join(f'"{k}"="{v}"' for k, v in sorted(labels.items()))
    with tempfile.TemporaryDirectory(prefix=f"horizon-harbor-{task.id}-") as ctx:
        shutil.copytree(pathlib.Path(task.metadata["harbor_dir"]) / "environment", ctx, dirs_exist_ok=True)
        (pathlib.Path(ctx) / "Dockerfile").write_text(task.metadata["dockerfile"] + label_line + "\n")
        try:
            client.images.build(path=ctx, tag=task.image, pull=False, rm=True, forcerm=True)
        except docker.errors.BuildError as e:
            log = "".join(str(c.get("stream", c.get("error", ""))) for c in e.build_log).strip().splitlines()
            raise TaskError(f"building {task.image} failed: {e} (last log line: {log[-1] if log else ''})") from e
    return "built"


def _write_tree(sandbox, root: str, files: dict[str, str], timeout: float) -> None:
    sandbox.exec(f"rm -rf {root}/* {root}/.[!.]* 2>/dev/null; mkdir -p {root}", timeout=timeout, workdir="/")
    for rel, content in files.items():
        sandbox.write_file(f"{root}/{rel}", content, mode=0o755 if rel.endswith(".sh") else 0o644)


def run_solution(task: Task, sandbox, timeout: float | None = None):
    """The gold policy: solution/ copied to /solution, ``bash /solution/solve.sh`` in the WORKDIR.
    Returns the `ExecResult`; `TaskError` if the directory ships no solve.sh."""
    md = task.metadata
    if not md.get("solution"):
        raise TaskError(f"task {task.id!r}: the Harbor directory has no solution/solve.sh")
    timeout = timeout or float(md["toml"].get("agent", {}).get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S))
    _write_tree(sandbox, SOLUTION_DIR, md["solution"], timeout)
    return sandbox.exec(f"bash {SOLUTION_DIR}/solve.sh", timeout=timeout, workdir=md["workdir"])


def parse_reward(text: str) -> float | None:
    """The reward in a reward.txt (one number), or None when it holds none."""
    try:
        return float(text.strip())
    except ValueError:
        return None


def grade(task: Task, sandbox, timeout: float | None = None):
    """`VerifyResult` of a Harbor task's final sandbox state (module docstring). Raises
    `SandboxInfraError` when the sandbox fails; everything else the policy did is a score."""
    md = task.metadata
    timeout = timeout or md["verifier_timeout_s"]
    _write_tree(sandbox, TESTS_DIR, md["tests"], timeout)
    sandbox.exec(f"mkdir -p /logs/verifier && rm -f {REWARD_FILE}", timeout=timeout, workdir="/")
    r = sandbox.exec(f"bash {TESTS_DIR}/test.sh", timeout=timeout, workdir=md["workdir"])
    head = f"[harbor] test.sh exit {r.exit_code}{' (timed out)' if r.timed_out else ''}\n{r.output[-4000:]}"
    try:
        text = sandbox.read_file(REWARD_FILE).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return VerifyResult(0.0, 0, 1, f"{head}\n[harbor] no {REWARD_FILE} written: reward 0")
    reward = parse_reward(text)
    if reward is None:
        return VerifyResult(0.0, 0, 1, f"{head}\n[harbor] {REWARD_FILE} holds no number ({text[:100]!r}): reward 0")
    return VerifyResult(reward, int(reward >= 1.0), 1, head)
