"""Real-repository generator rules without Docker (docs/SPEC.md §5, §7): manifest parsing,
test-file exclusion, flaky screening, the kept-iff verdict, problem statements, candidate dedup."""

import pytest

from horizon.taskgen import candidates, coverage, generate, instances, mutate, repos, verdicts
from horizon.tasks.task import TaskError
from horizon.utils.config import ConfigError

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
    v = verdicts.verdict({"t::a": "FAILED", "t::b": "PASSED", "t::c": "PASSED", "t::flaky": "FAILED"}, stable,
                         False, {"t::a": "assert 1 == 2"})
    assert v.status == "kept" and v.fail_to_pass == ("t::a",) and v.pass_to_pass == ("t::b", "t::c")
    assert verdicts.verdict(dict.fromkeys(stable, "PASSED"), stable, False).status == "no_failure"
    assert verdicts.verdict({"t::a": "FAILED"}, stable, False).status == "missing"
    assert verdicts.verdict({}, stable, True).status == "timeout"


def test_failure_messages_and_statement():
    report = ("PASSED tests/t.py::ok\nFAILED tests/t.py::test_x - AssertionError: assert 3 == 4\n"
              "ERROR tests/t.py::test_y\n")
    msgs = verdicts.failure_messages(report)
    assert msgs == {"tests/t.py::test_x": "AssertionError: assert 3 == 4", "tests/t.py::test_y": "error"}
    v = verdicts.Verdict("kept", ("tests/t.py::test_x",), ("tests/t.py::ok",), msgs)
    text = instances.problem_statement(SPEC, v)
    assert "tests/t.py::test_x: AssertionError: assert 3 == 4" in text and "1 failing test:" in text


def test_candidates_distinct_and_seeded():
    src = "def f(a, b):\n    if a < b:\n        return a + b\n    return a * 2\n"
    files = {"src/demo/m.py": src, "src/demo/n.py": src}
    ms = candidates.candidate_mutations(files, ["src/demo/m.py", "src/demo/n.py"], 6, seed=3)
    assert len(ms) == 6 and len({(m.path, m.source) for m in ms}) == 6
    assert [m.source for m in ms] == [m.source for m in candidates.candidate_mutations(files, list(files), 6, seed=3)]
    keys = {verdicts.candidate_key("tree", m) for m in ms}
    assert len(keys) == 6 and all(m.kind in mutate.KINDS for m in ms)
    with pytest.raises(TaskError, match="no mutable"):
        candidates.candidate_mutations(files, [], 3, 0)


def test_candidate_key_pinned():
    """The verdict cache key of a fixed candidate (a change here invalidates every cached verdict)."""
    m = mutate.Mutation("operator_swap", "src/demo/m.py", 2, 4, "f", "a + b -> a - b", "x = a + b\n", "x = a - b\n",
                        "", "")
    assert verdicts.candidate_key("tree", m) == "1a4d37bf951d5b5e86c63bee574fd8120b52ac9054c9e9199474bb80c7b01577"


@pytest.mark.parametrize("field, value", [("n_candidates", -1), ("combine_size", 1), ("workers", 0), ("seed", True),
                                          ("max_instances", 1.5)])
def test_gen_options_checked(field, value):
    with pytest.raises(ConfigError, match=f"gen.{field}"):
        generate.GenOptions(**{"n_candidates": 1, field: value})


def test_coverage_plugin_shipped_not_collected():
    """The container plugin is a module of the package, read back as text; the repo's pytest never
    collects it (not a test file name, not under a test path)."""
    src = coverage.plugin_source()
    compile(src, coverage.PLUGIN_FILE, "exec")
    assert "def pytest_runtest_protocol(" in src and "HORIZON_SELECT" in src
    assert not coverage.PLUGIN_FILE.startswith("test_") and not coverage.PLUGIN_FILE.endswith("_test.py")
    assert f"-p {coverage.PLUGIN_NAME} " in coverage.plugin_command(SPEC)
