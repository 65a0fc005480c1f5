"""Verifier: pytest summary parsing, reward modes, answer matching, never raising (docs/SPEC.md §5)."""

import pytest

from horizon.sandbox.base import ExecResult
from horizon.tasks import Task, answer_matches, normalize_answer, parse_pytest_summary, verify


@pytest.mark.parametrize("out,counts", [
    ("..F.\n1 failed, 3 passed in 0.05s\n", (3, 1, 0)),
    ("===== 2 passed, 1 error in 0.31s =====", (2, 0, 1)),
    ("=== 1 failed, 4 passed, 2 skipped, 1 xpassed, 3 warnings in 1.20s ===", (5, 1, 0)),
    ("ERROR collecting tests/test_a.py\n1 error in 0.10s\n", (0, 0, 1)),
    ("5 errors in 0.2s", (0, 0, 5)),
    ("no tests ran in 0.01s", (0, 0, 0)),
    ("12 passed in 61.20s (0:01:01)", (12, 0, 0)),
    # a test printing a summary-like line earlier must not win over the real (last) one
    ("3 passed in 1.0s\n....\n2 failed, 2 passed in 0.5s", (2, 2, 0)),
])
def test_parse_summary(out, counts):
    c = parse_pytest_summary(out)
    assert c.found and (c.passed, c.failed, c.errors) == counts


def test_parse_summary_absent():
    assert not parse_pytest_summary("Traceback...\nImportError: boom\n").found


class FakeSandbox:
    """Canned `exec` results; records writes (protected test files are restored first)."""

    def __init__(self, output="", exit_code=0, timed_out=False, raises=None, files=None):
        self.result = ExecResult(exit_code, output, timed_out, False, 0.01)
        self.raises, self.files, self.writes = raises, dict(files or {}), []

    def exec(self, cmd, timeout=None, workdir="/workspace"):
        if self.raises:
            raise self.raises
        if cmd.startswith("find "):
            return ExecResult(0, "".join(f"./{p}\n" for p in self.files), False, False, 0.0)
        return self.result

    def read_file(self, path):
        rel = path.removeprefix("/workspace/")
        if rel not in self.files:
            raise FileNotFoundError(path)
        return self.files[rel].encode()

    def write_file(self, path, data, mode=0o644):
        self.writes.append(path)


def task(mode="binary", **kw):
    return Task(id="t", prompt="p", files={"a.py": "", "tests/test_a.py": ""}, test_cmd="pytest -q",
                reward_mode=mode, **kw)


def test_fraction_and_binary_rewards():
    sb = FakeSandbox("2 failed, 3 passed in 0.1s", exit_code=1)
    frac = verify(task("fraction"), sb)
    assert (frac.reward, frac.passed, frac.total) == (pytest.approx(0.6), 3, 5)
    assert sb.writes == ["/workspace/tests/test_a.py"]   # tests restored before running
    assert verify(task("binary"), sb).reward == 0.0
    ok = FakeSandbox("5 passed in 0.1s", exit_code=0)
    assert verify(task("binary"), ok).reward == 1.0 and verify(task("fraction"), ok).reward == 1.0


def test_timeouts_errors_and_non_pytest():
    slow = verify(task("fraction"), FakeSandbox("1 passed", exit_code=124, timed_out=True))
    assert slow.reward == 0.0 and "timed out" in slow.output
    broken = verify(task(), FakeSandbox(raises=RuntimeError("container vanished")))
    assert broken.reward == 0.0 and "container vanished" in broken.output
    assert verify(task(), FakeSandbox("all good", exit_code=0)).reward == 1.0   # plain command: exit code
    assert verify(task(), FakeSandbox("bad", exit_code=2)).reward == 0.0
    # exit 0 but nothing passed ("no tests ran" exits 5 in pytest; be strict either way)
    assert verify(task(), FakeSandbox("no tests ran in 0.01s", exit_code=0)).reward == 0.0


def test_answer_matching():
    assert normalize_answer("  The `PORT` is\n\"8443\". ") == "the port is 8443 ."
    exp = [["5", "five"]]
    assert answer_matches(exp, "It tries **5** times.")[0]
    assert answer_matches(exp, "Five attempts")[0]
    assert not answer_matches(exp, "15 attempts")[0]
    assert not answer_matches(exp, "backoff is 2.5s, 4 retries")[0]
    assert answer_matches([["parse_timestamp"]], "see importer.dates.parse_timestamp()")[0]
    assert not answer_matches([["parse_timestamp"]], "parse_timestamps")[0]
    both = [["amber-cedar-1234"], ["data/shard_03.log", "shard_03.log"]]
    assert answer_matches(both, "Amber-Cedar-1234\n/workspace/data/shard_03.log") == (True, [True, True])
    assert answer_matches(both, "amber-cedar-1234 shard_04.log") == (False, [True, False])


def test_answer_mode_reads_answer_file_and_checks_edits():
    q = Task(id="q", prompt="p", files={"a.py": "x = 1\n"}, test_cmd="", reward_mode="answer",
             should_edit=False, kind="question", metadata={"expected": [["42"]]})
    assert verify(q, FakeSandbox(files={"a.py": "x = 1\n"}), final_answer="42").reward == 1.0
    assert verify(q, FakeSandbox(files={"a.py": "x = 1\n", "ANSWER.txt": "42"})).reward == 1.0
    assert verify(q, FakeSandbox(files={"a.py": "x = 1\n"}), final_answer="41").reward == 0.0
    edited = verify(q, FakeSandbox(files={"a.py": "x = 2\n"}), final_answer="42")
    assert edited.reward == 0.0 and "a.py" in edited.output
    new_file = verify(q, FakeSandbox(files={"a.py": "x = 1\n", "notes.md": ""}), final_answer="42")
    assert new_file.reward == 0.0
    cache_only = FakeSandbox(files={"a.py": "x = 1\n", "__pycache__/a.pyc": ""})
    assert verify(q, cache_only, final_answer="42").reward == 1.0
