"""Real-repository generator rules without Docker (SPEC §5, §7; issue 26 item 2): manifest parsing,
test-file exclusion, flaky screening, the kept-iff verdict, problem statements, candidate dedup."""

import pytest

from horizon.taskgen import generate, mutate, repos
from horizon.tasks.task import TaskError

SPEC = repos.RepoSpec("demo", "1.0", "demo-1.0.tar.gz", "0" * 64, ("tests",), ("src/demo",))
ENTRY = {"name": "demo", "version": "1.0", "sdist": "demo-1.0.tar.gz", "sha256": "0" * 64, "tests": ["tests"],
         "sources": ["src/demo"]}


def test_manifest_has_eight_repos_pinned():
    specs = repos.load_manifest()
    assert len(specs) >= 8 and all(len(s.sha256) == 64 for s in specs)
    assert repos.select(specs, ["parse"])[0].image == "horizon-repo:parse-1.22.4"


@pytest.mark.parametrize("field, value, msg", [("sha256", "abc", "sha256"), ("tests", [], "tests"),
                                               ("sources", ["/abs"], "sources"), ("name", "Bad Name", "name")])
def test_bad_manifest_entry_one_line(field, value, msg):
    with pytest.raises(TaskError, match=msg) as e:
        repos.parse_spec({**ENTRY, field: value})
    assert "\n" not in str(e.value)


def test_select_unknown_name():
    with pytest.raises(TaskError, match="unknown repository"):
        repos.select([SPEC], ["nope"])


def test_source_files_exclude_tests():
    paths = ["src/demo/a.py", "src/demo/tests/test_a.py", "src/demo/conftest.py", "src/demo/b_test.py",
             "src/demo/data.txt", "tests/test_x.py", "setup.py", "src/demo/sub/c.py"]
    assert repos.source_files(paths, SPEC) == ["src/demo/a.py", "src/demo/sub/c.py"]


def test_screen_excludes_flaky():
    runs = [{"t::a": "PASSED", "t::b": "PASSED", "t::c": "FAILED", "t::d": "XFAIL"},
            {"t::a": "PASSED", "t::b": "FAILED", "t::c": "FAILED", "t::d": "XFAIL"}]
    assert repos.screen(runs) == (["t::a", "t::d"], ["t::b", "t::c"])


def test_verdict_rule():
    stable = ["t::a", "t::b", "t::c"]
    v = generate.verdict({"t::a": "FAILED", "t::b": "PASSED", "t::c": "PASSED", "t::flaky": "FAILED"}, stable,
                         False, {"t::a": "assert 1 == 2"})
    assert v.status == "kept" and v.fail_to_pass == ("t::a",) and v.pass_to_pass == ("t::b", "t::c")
    assert generate.verdict(dict.fromkeys(stable, "PASSED"), stable, False).status == "no_failure"
    assert generate.verdict({"t::a": "FAILED"}, stable, False).status == "missing"
    assert generate.verdict({}, stable, True).status == "timeout"


def test_failure_messages_and_statement():
    report = ("PASSED tests/t.py::ok\nFAILED tests/t.py::test_x - AssertionError: assert 3 == 4\n"
              "ERROR tests/t.py::test_y\n")
    msgs = generate.failure_messages(report)
    assert msgs == {"tests/t.py::test_x": "AssertionError: assert 3 == 4", "tests/t.py::test_y": "error"}
    v = generate.Verdict("kept", ("tests/t.py::test_x",), ("tests/t.py::ok",), msgs)
    text = generate.problem_statement(SPEC, v)
    assert "tests/t.py::test_x: AssertionError: assert 3 == 4" in text and "1 failing test:" in text


def test_candidates_distinct_and_seeded():
    src = "def f(a, b):\n    if a < b:\n        return a + b\n    return a * 2\n"
    files = {"src/demo/m.py": src, "src/demo/n.py": src}
    ms = generate.candidate_mutations(files, ["src/demo/m.py", "src/demo/n.py"], 6, seed=3)
    assert len(ms) == 6 and len({(m.path, m.source) for m in ms}) == 6
    assert [m.source for m in ms] == [m.source for m in generate.candidate_mutations(files, list(files), 6, seed=3)]
    keys = {generate.candidate_key("tree", m) for m in ms}
    assert len(keys) == 6 and all(m.kind in mutate.KINDS for m in ms)
    with pytest.raises(TaskError, match="no mutable"):
        generate.candidate_mutations(files, [], 3, 0)
