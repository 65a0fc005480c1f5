"""Score a task's final sandbox state (docs/SPEC.md §5 "a verifier runs the task's tests").

Test tasks (reward_mode "binary" / "fraction"):
  1. the task's protected files (by default every initial file under tests/) are restored
     to their original content, so a policy cannot pass by editing the tests;
  2. `test_cmd` runs in /workspace with a timeout;
  3. pytest's summary line ("3 passed, 1 failed, 2 errors in 0.1s") is parsed.
  binary: 1.0 iff the command exits 0, did not time out, and no test failed or errored.
  fraction: passed / (passed + failed + errors); 0.0 on timeout. Commands without a pytest
  summary count as one test that passed iff the exit code is 0.

Answer tasks (reward_mode "answer": questions, recall):
  The candidate is the final answer plus /workspace/ANSWER.txt (if present). Both sides are
  normalised (NFKC, lower case, quotes/backticks/asterisks -> spaces, whitespace collapsed);
  `metadata["expected"]` is a list of groups, each a list of acceptable strings, and every
  group must have one string present as a whole token (not inside a longer identifier or
  number: "5" does not match "15" or "2.5"). For should_edit=False tasks any change to the
  workspace (a modified, deleted or new file, ignoring caches and ANSWER.txt) scores 0
  ("eager editing", docs/SPEC.md §7 behaviour evals) unless `check_edits=False`.
  With `metadata["answer_match"] == "exact"` the normalised final message must EQUAL one
  string of each group (ANSWER.txt ignored): listing every candidate scores 0.

Imported tasks (reward_mode "swebench" / "harbor"): `horizon.tasks.swebench.grade` (per-test
pytest report: FAIL_TO_PASS and PASS_TO_PASS all pass) / `horizon.tasks.harbor.grade` (tests/test.sh
and its reward file), each with its own default timeout unless the caller passes one.

`verify` never raises on sandbox trouble: it returns reward 0 with the error in `output`.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata

from horizon.sandbox.base import SandboxInfraError
from horizon.tasks import harbor, swebench
from horizon.tasks.recall import ANSWER_PATH
from horizon.tasks.result import VerifyResult
from horizon.tasks.task import Task

WORKSPACE = "/workspace"
DEFAULT_VERIFY_TIMEOUT_S = 120.0
_COUNT_RE = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)\b")
_SUMMARY_RE = re.compile(r"^=*\s*(?:\d+ \w+(?:, )?)+.* in [\d.]+s", re.M)
_CACHE_PARTS = ("__pycache__", ".pytest_cache")
# Imported task formats grade themselves: reward_mode -> grade(task, sandbox, timeout) -> VerifyResult.
GRADERS = {swebench.REWARD_MODE: swebench.grade, harbor.REWARD_MODE: harbor.grade}


@dataclasses.dataclass(frozen=True)
class PytestCounts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    found: bool = False      # a pytest summary line was present

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errors


def parse_pytest_summary(output: str) -> PytestCounts:
    """Counts from the last pytest summary line in `output` (`found=False` if none).

    Handles `-q` ("1 failed, 2 passed in 0.05s"), the framed default
    ("==== 2 passed, 1 error in 0.1s ===="), "no tests ran" and xpassed (counted passed).
    """
    lines = [ln for ln in output.splitlines() if _SUMMARY_RE.search(ln) or "no tests ran" in ln]
    if not lines:
        return PytestCounts()
    counts: dict[str, int] = {}
    for n, word in _COUNT_RE.findall(lines[-1]):
        key = {"error": "errors", "warning": "warnings"}.get(word, word)
        counts[key] = counts.get(key, 0) + int(n)
    return PytestCounts(passed=counts.get("passed", 0) + counts.get("xpassed", 0), failed=counts.get("failed", 0),
                        errors=counts.get("errors", 0), skipped=counts.get("skipped", 0), found=True)


def normalize_answer(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = re.sub(r"[`*\"'\u2018\u2019\u201c\u201d]", " ", text)
    return " ".join(text.split())


def _contains_token(haystack: str, needle: str) -> bool:
    pat = r"(?<![a-z0-9_])(?<!\d\.)" + re.escape(needle) + r"(?![a-z0-9_])(?!\.\d)"
    return re.search(pat, haystack) is not None


def answer_matches(expected: list[list[str]], answer: str) -> tuple[bool, list[bool]]:
    """(all groups matched, per-group matched) for normalised `answer` (see module docstring)."""
    norm = normalize_answer(answer)
    per_group = [any(_contains_token(norm, normalize_answer(alt)) for alt in group) for group in expected]
    return all(per_group), per_group


def protected_paths(task: Task) -> list[str]:
    """Files restored before the tests run: metadata["protected_paths"] or tests/**."""
    paths = task.metadata.get("protected_paths")
    if paths is None:
        paths = [p for p in task.files if p.startswith("tests/")]
    return sorted(paths)


def changed_files(task: Task, sandbox, timeout: float = 30.0) -> list[str]:
    """Workspace files that differ from the task's initial files (modified, deleted or new).

    Raises on sandbox errors (callers decide).
    """
    r = sandbox.exec("find . -type f -print", timeout=timeout, workdir=WORKSPACE)
    if r.exit_code != 0:
        raise RuntimeError(f"listing the workspace failed (exit {r.exit_code}): {r.output[-500:]}")
    present = {ln[2:] if ln.startswith("./") else ln for ln in r.output.splitlines() if ln.strip()}
    present = {p for p in present if not any(part in _CACHE_PARTS for part in p.split("/"))
               and not p.endswith(".pyc") and p != ANSWER_PATH}
    changed = sorted(present - set(task.files))
    for path, content in task.files.items():
        if path not in present:
            changed.append(path)
            continue
        if sandbox.read_file(f"{WORKSPACE}/{path}") != content.encode("utf-8"):
            changed.append(path)
    return sorted(changed)


def _read_answer_file(sandbox) -> str:
    try:
        return sandbox.read_file(f"{WORKSPACE}/{ANSWER_PATH}").decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _verify_answer(task: Task, sandbox, final_answer: str, check_edits: bool, timeout: float) -> VerifyResult:
    answer_file = _read_answer_file(sandbox)
    candidate = final_answer + "\n" + answer_file
    if task.metadata.get("answer_match") == "exact":   # the final message IS the answer (one group)
        per_group = [normalize_answer(final_answer) in {normalize_answer(a) for a in g}
                     for g in task.metadata["expected"]]
        ok = all(per_group)
    else:
        ok, per_group = answer_matches(task.metadata["expected"], candidate)
    notes = [f"answer groups matched: {per_group}", f"final answer: {final_answer[:500]!r}"]
    if answer_file:
        notes.append(f"{ANSWER_PATH}: {answer_file[:500]!r}")
    if check_edits and not task.should_edit:
        changed = changed_files(task, sandbox, timeout=timeout)
        if changed:
            notes.append(f"edited files on a no-edit task: {changed}")
            ok = False
    return VerifyResult(reward=float(ok), passed=int(ok), total=1, output="\n".join(notes))


def _verify_tests(task: Task, sandbox, timeout: float) -> VerifyResult:
    for path in protected_paths(task):
        sandbox.write_file(f"{WORKSPACE}/{path}", task.files[path])
    r = sandbox.exec(task.test_cmd, timeout=timeout, workdir=WORKSPACE)
    counts = parse_pytest_summary(r.output)
    if r.timed_out:
        return VerifyResult(0.0, counts.passed, counts.total, f"[verifier] timed out after {timeout}s\n{r.output}")
    if not counts.found:   # not pytest (or it died before summarising): one pass/fail bit
        ok = r.exit_code == 0
        return VerifyResult(float(ok), int(ok), 1, f"[verifier] exit code {r.exit_code}\n{r.output}")
    clean = r.exit_code == 0 and counts.failed == 0 and counts.errors == 0 and counts.passed > 0
    if task.reward_mode == "binary":
        reward = float(clean)
    else:
        reward = 1.0 if clean else (counts.passed / counts.total if counts.total else 0.0)
    return VerifyResult(reward, counts.passed, counts.total, f"[verifier] exit code {r.exit_code}\n{r.output}")


def verify(task: Task, sandbox, final_answer: str = "", timeout: float | None = None, *,
           check_edits: bool = True) -> VerifyResult:
    """Score `sandbox`'s final state for `task` (module docstring); never raises on sandbox errors.
    `timeout` None: the mode's own default (`DEFAULT_VERIFY_TIMEOUT_S`; the importers' graders theirs).
    A dead or unusable sandbox (`SandboxInfraError`) is not a score: the result carries
    `infra_error` and the caller retries the episode (docs/SPEC.md §4.1 "infrastructure is not the policy")."""
    try:
        if task.reward_mode in GRADERS:
            return GRADERS[task.reward_mode](task, sandbox, timeout)
        timeout = DEFAULT_VERIFY_TIMEOUT_S if timeout is None else timeout
        if task.reward_mode == "answer":
            return _verify_answer(task, sandbox, final_answer, check_edits, timeout)
        return _verify_tests(task, sandbox, timeout)
    except SandboxInfraError as e:
        return VerifyResult(0.0, 0, 0, f"[verifier] sandbox failed: {e}", infra_error=str(e) or type(e).__name__)
    except Exception as e:  # noqa: BLE001 - a broken sandbox scores 0, it does not crash the trainer
        return VerifyResult(0.0, 0, 0, f"[verifier] error: {type(e).__name__}: {e}")
