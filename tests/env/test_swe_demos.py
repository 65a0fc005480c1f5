"""Gold-patch demonstrations on real repositories, without Docker (docs/REAL_REPOS.md): the diff's
hunks and the engineer's script built from them. The Docker smoke (two generated instances, one
kept, one dropped) is `tests/tasks/test_generate_docker.py::test_gold_patch_demos`."""

import difflib

from horizon.agent.scripted import ScriptedPolicy
from horizon.data.tokenizer import ByteTokenizer
from horizon.env.swe_demos import demo_script, edit_strings, pytest_run
from horizon.tasks.swebench import patch_hunks
from horizon.tasks.task import Task
from horizon.tools.format import parse_action

TOK = ByteTokenizer()
BEFORE = "import os\n\n\ndef f(x):\n    return x + 1\n" + "".join(f"y{i} = {i}\n" for i in range(12)) + \
         "-- not a header\n\ndef g():\n    return 'b'\n"


def _diff(before: str, after: str, path: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}"))


def test_hunks_of_a_two_hunk_two_file_patch():
    after = BEFORE.replace("x + 1", "x - 1").replace("-- not a header", "--- changed").replace("'b'", "'a'")
    patch = _diff(BEFORE, after, "pkg/m.py") + _diff("a = 1\n", "a = 2\nb = 3\n", "pkg/n.py") + \
        "\\ No newline at end of file\n"
    hunks = patch_hunks(patch)
    assert [(h.path, h.new_start) for h in hunks] == [("pkg/m.py", 2), ("pkg/m.py", 15), ("pkg/n.py", 1)]
    for h in hunks[:2]:                       # applying each hunk's old -> new rebuilds the new file
        assert BEFORE.count(h.old) == 1
    rebuilt = BEFORE
    for h in hunks[:2]:
        rebuilt = rebuilt.replace(h.old, h.new)
    assert rebuilt == after
    assert "-- not a header" in hunks[1].old and "--- changed" in hunks[1].new   # a body line, not a header
    assert (hunks[2].old, hunks[2].new) == ("a = 1", "a = 2\nb = 3")
    assert hunks[1].new_start == after.splitlines().index("y9 = 9") + 1            # its first line, the diff's +c


def _task(patch: str, tests=("tests/test_m.py::test_f", "tests/test_m.py::test_g[1]")) -> Task:
    return Task(id="m-1", prompt="Some of m's tests fail.", files={}, test_cmd="true", reward_mode="swebench",
                kind="bugfix",
                metadata={"patch": patch, "fail_to_pass": list(tests)})


def test_a_patch_of_several_hunks_takes_several_edit_calls():
    after = BEFORE.replace("x + 1", "x - 1").replace("'b'", "'a'")
    patch = _diff(BEFORE, after, "pkg/m.py")
    assert len(patch_hunks(patch)) == 2
    script = demo_script(_task(patch))
    acts = [parse_action(text) for _, text in script]
    assert [a.name if a.kind == "call" else a.kind for a in acts] == \
        ["run_shell", "read_file", "edit_file", "read_file", "edit_file", "run_shell", "final"]
    edits = [a.args for a in acts if a.name == "edit_file"]
    assert [(e["old_str"], e["new_str"]) for e in edits] == [edit_strings(h) for h in patch_hunks(patch)]
    assert all(e["path"] == "/workspace/pkg/m.py" and e["command"] == "str_replace" for e in edits)
    reads = [a.args for a in acts if a.name == "read_file"]
    assert [int(r["start_line"]) for r in reads] == [1, patch_hunks(patch)[1].new_start - 6]   # text until the registry
    assert acts[0].args["command"] == pytest_run(["tests/test_m.py::test_f", "tests/test_m.py::test_g[1]"])
    assert "'tests/test_m.py::test_g[1]'" in pytest_run(["tests/test_m.py::test_g[1]"])   # quoted for bash


def test_the_scripted_policy_plays_the_script_with_its_thoughts():
    patch = _diff(BEFORE, BEFORE.replace("x + 1", "x - 1"), "pkg/m.py")
    t = _task(patch)
    pol = ScriptedPolicy({t.prompt: demo_script(t)}, TOK)
    from horizon.agent import Message, render

    r = render([Message("system", "sys", kind="system"), Message("user", t.prompt, kind="task")], TOK)
    out = TOK.decode([int(x) for x in pol([r.tokens], 4096)[0].tokens])
    assert out.startswith("<think>[step 0] Run the failing tests to see the error.</think>\n") and "run_shell" in out


def test_diagnosis_reads_edits_and_names_the_failure_mode():
    from horizon.tasks.diagnosis import DIFF_CMD, UNTRACKED, failure_mode, parse_edits
    from horizon.tasks.result import VerifyResult

    assert DIFF_CMD.startswith("git diff -U0")
    out = ("diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -5 +5 @@\n-a\n+b\n"
           "@@ -20,0 +21,2 @@\n+c\n+d\ndiff --git a/tests/test_m.py b/tests/test_m.py\n@@ -1 +1 @@\n-x\n+y\n"
           f"{UNTRACKED}\npkg/new.py\npkg/__pycache__/m.cpython-311.pyc\n.pytest_cache/v/cache/nodeids\n"
           "pkg.egg-info/PKG-INFO\n")
    edits = parse_edits(out, protected=["tests/test_m.py"])
    assert edits == {"pkg/m.py": [(5, 5), (20, 20)], "pkg/new.py": []}      # tests and caches left out
    ok, f2p, p2p = (VerifyResult(1.0, 3, 3, ""), VerifyResult(0.0, 1, 3, "", details=dict(f2p_failed=2, p2p_failed=0)),
                    VerifyResult(0.0, 2, 3, "", details=dict(f2p_failed=0, p2p_failed=1)))
    gold = {"pkg/m.py"}
    assert failure_mode(ok, "final", edits, gold) == "solved"
    assert failure_mode(f2p, "malformed", edits, gold) == "malformed"
    assert failure_mode(f2p, "final", {}, gold) == "no_edit"
    assert failure_mode(f2p, "final", {"pkg/other.py": [(1, 1)]}, gold) == "wrong_file"
    assert failure_mode(p2p, "final", edits, gold) == "broke_other_tests"
    assert failure_mode(f2p, "final", edits, gold) == "wrong_edit"
    assert failure_mode(VerifyResult(0.0, 0, 3, "", details=dict(timed_out=True)), "final", edits, gold) == "timeout"


def test_unseen_instances_are_a_stable_fraction_of_each_train_repository():
    from horizon.taskgen.generate import hold_out_unseen
    from horizon.tasks.swebench import SweInstance

    def inst(repo, i):
        return SweInstance(f"{repo}__x-{i}", f"pypi/{repo}", "abc", "p", "", "s", ("t::a",), (), "img")
    insts = [inst("a", i) for i in range(10)] + [inst("b", i) for i in range(3)] + [inst("c", 0)]
    train, unseen = hold_out_unseen(insts, 0.2)
    by = lambda xs, r: sorted(x.instance_id for x in xs if x.repo == f"pypi/{r}")   # noqa: E731
    assert [len(by(unseen, r)) for r in "abc"] == [2, 1, 0]          # 20% rounded, at least one, never all
    assert sorted(i.instance_id for i in train + unseen) == sorted(i.instance_id for i in insts)
    more, more_unseen = hold_out_unseen(insts + [inst("b", 3)], 0.2)
    assert set(by(unseen, "a")) == set(by(more_unseen, "a"))          # adding instances elsewhere moves nothing
    assert hold_out_unseen(insts, 0.0) == (insts, [])


def test_an_edit_keeps_one_line_of_context():
    after = BEFORE.replace("x + 1", "x - 1")
    (h,) = patch_hunks(_diff(BEFORE, after, "m.py"))
    assert edit_strings(h) == ("def f(x):\n    return x + 1\ny0 = 0", "def f(x):\n    return x - 1\ny0 = 0")
    (ins,) = patch_hunks(_diff(BEFORE, BEFORE.replace("y5 = 5\n", "y5 = 5\nz = 0\n"), "m.py"))
    old, new = edit_strings(ins)                                  # a pure insertion keeps two lines each side
    assert old == "y4 = 4\ny5 = 5\ny6 = 6\ny7 = 7" and new == "y4 = 4\ny5 = 5\nz = 0\ny6 = 6\ny7 = 7"
    assert BEFORE.replace(old, new) == BEFORE.replace("y5 = 5\n", "y5 = 5\nz = 0\n")


def test_an_edit_widens_its_context_until_it_is_unique_in_the_file():
    text = "a\nb\nx\nc\nd\nb\nx\nc\ne\n"                       # "b\nx\nc" occurs twice
    after = "a\nb\nx\nc\nd\nb\ny\nc\ne\n"
    (h,) = patch_hunks(_diff(text, after, "m.py"))
    assert edit_strings(h) == ("b\nx\nc", "b\ny\nc")                  # one line of context, not unique
    assert edit_strings(h, text) == ("d\nb\nx\nc\ne", "d\nb\ny\nc\ne")  # two: unique
    script = demo_script(_task(_diff(text, after, "m.py")), {"m.py": text})
    edit = next(parse_action(x).args for _, x in script if "edit_file" in x)
    assert text.count(edit["old_str"]) == 1 and text.replace(edit["old_str"], edit["new_str"]) == after


def test_chunks_never_hold_two_tasks_with_one_prompt():
    from horizon.env.swe_demos import prompt_chunks

    tasks = [Task(id=f"t{i}", prompt=p, files={}, test_cmd="true") for i, p in enumerate("aabac")]
    chunks = prompt_chunks(tasks, 2)
    assert [[t.id for t in ch] for ch in chunks] == [["t0", "t2"], ["t1", "t4"], ["t3"]]   # first chunk with room
