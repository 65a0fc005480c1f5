"""Gold-patch demonstrations on real repositories, without Docker (docs/REAL_REPOS.md): the diff's
hunks and the engineer's script built from them. The Docker smoke (two generated instances, one
kept, one dropped) is `tests/tasks/test_generate_docker.py::test_gold_patch_demos`."""

import difflib
import pathlib
import types

import ml_collections
import numpy as np

from horizon.agent.scripted import ScriptedPolicy
from horizon.data.tokenizer import ByteTokenizer
from horizon.env import swe_demos
from horizon.env.swe_demos import (
    SUITE_RUN,
    DemoReport,
    agent_turns,
    demo_key,
    demo_script,
    edit_strings,
    library_frames,
    load_rows,
    print_command,
    prompt_chunks,
    read_anchor,
    save_rows,
    turn_kind,
)
from horizon.inference import sampler
from horizon.tasks.swebench import Hunk, patch_hunks
from horizon.tasks.task import Task
from horizon.tools.format import parse_action, render_call, render_final, render_summary, tool_format
from horizon.utils.config import sibling_config

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
        ["run_shell", "run_shell", "edit_file", "run_shell", "edit_file", "run_shell", "final"]
    edits = [a.args for a in acts if a.name == "edit_file"]
    assert [(e["old_str"], e["new_str"]) for e in edits] == [edit_strings(h) for h in patch_hunks(patch)]
    assert all(e["path"] == "/workspace/pkg/m.py" and e["command"] == "str_replace" for e in edits)
    reads = [acts[1].args["command"], acts[3].args["command"]]     # the file printed as the edit copies it
    mid = [h.new_start + h.old.count("\n") // 2 for h in patch_hunks(patch)]     # no frames: the hunk's middle
    assert reads == [f"awk 'NR>={m}-10 && NR<={m}+10' /workspace/pkg/m.py" for m in mid]
    assert acts[0].args["command"] == acts[-2].args["command"] == SUITE_RUN      # one fixed run, before and after
    assert SUITE_RUN.startswith("python3 -m pytest -x ") and SUITE_RUN.endswith("exit ${PIPESTATUS[0]}")


PYTEST_OUT = """=================================== FAILURES ===================================
_____________________ CacheWrapperTest.test_decorator_info _____________________
tests/test_cached.py:266: in test_decorator_info
    self.assertEqual(wrapper.cache_info(), (0, 0, 2, 0))
src/pkg/_decorator.py:130: in cache_info
    return self.__info(self.__hits, self.cache, self.__misses)
src/pkg/m.py:40: in _make_info
    return cls(hits, misses, None, len(cache))
E   TypeError: object of type 'int' has no len()
"""


def test_the_print_before_an_edit_is_at_the_failing_frame_when_its_window_holds_the_hunk():
    assert library_frames(PYTEST_OUT) == [("src/pkg/_decorator.py", 130), ("src/pkg/m.py", 40)]   # tests left out
    frames = library_frames(PYTEST_OUT)
    hunk = lambda path, start, old: Hunk(path, start, old, old.upper())                 # noqa: E731
    assert read_anchor(hunk("src/pkg/m.py", 31, "a"), frames) == (40, 10, True)         # 9 lines above the frame
    assert read_anchor(hunk("src/pkg/m.py", 49, "a\nb"), frames) == (40, 10, True)      # its last line is the window's
    assert read_anchor(hunk("src/pkg/m.py", 50, "a\nb"), frames) == (50, 10, False)     # one past it: the hunk's own
    assert read_anchor(hunk("src/pkg/other.py", 40, "a"), frames) == (40, 10, False)    # another file
    assert read_anchor(hunk("src/pkg/m.py", 100, "\n".join("x" * 30)), []) == (114, 21, False)   # a long hunk fits
    cmd = print_command("/workspace/src/pkg/m.py", 40, 10)
    assert cmd == "awk 'NR>=40-10 && NR<=40+10' /workspace/src/pkg/m.py"                   # the frame's line, copied
    (h,) = patch_hunks(_diff(BEFORE, BEFORE.replace("y9 = 9", "y9 = 10"), "pkg/m.py"))
    script = demo_script(_task(_diff(BEFORE, BEFORE.replace("y9 = 9", "y9 = 10"), "pkg/m.py")), None,
                         [("pkg/m.py", h.new_start + 3)])
    assert parse_action(script[1][1]).args["command"] == print_command("/workspace/pkg/m.py", h.new_start + 3, 10)
    assert f"around line {h.new_start + 3}." in script[1][0]


def test_the_scripted_policy_plays_the_script_with_its_thoughts():
    patch = _diff(BEFORE, BEFORE.replace("x + 1", "x - 1"), "pkg/m.py")
    t = _task(patch)
    pol = ScriptedPolicy({t.prompt: demo_script(t)}, TOK)
    from horizon.agent import Message, render

    r = render([Message("system", "sys", kind="system"), Message("user", t.prompt, kind="task")], TOK)
    out = TOK.decode([int(x) for x in pol([r.tokens], 4096)[0].tokens])
    assert out.startswith("<think>[step 0] Run the tests to see what fails.</think>\n") and "run_shell" in out


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


def test_an_edit_is_its_changed_lines_with_context_on_request():
    after = BEFORE.replace("x + 1", "x - 1")
    (h,) = patch_hunks(_diff(BEFORE, after, "m.py"))
    assert edit_strings(h) == ("    return x + 1", "    return x - 1")                 # unique: no context
    assert edit_strings(h, context=1) == ("def f(x):\n    return x + 1\ny0 = 0", "def f(x):\n    return x - 1\ny0 = 0")
    expect = BEFORE.replace("y5 = 5\n", "y5 = 5\nz = 0\n")
    (ins,) = patch_hunks(_diff(BEFORE, expect, "m.py"))
    for context, (old, new) in ((0, ("y5 = 5\ny6 = 6", "y5 = 5\nz = 0\ny6 = 6")),      # an insertion keeps one
                                (1, ("y4 = 4\ny5 = 5\ny6 = 6\ny7 = 7", "y4 = 4\ny5 = 5\nz = 0\ny6 = 6\ny7 = 7"))):
        assert edit_strings(ins, context=context) == (old, new)                     # line more on each side
        assert BEFORE.replace(old, new) == expect


def test_an_edit_widens_its_context_until_it_is_unique_in_the_file():
    text = "a\nb\nx\nc\nd\nb\nx\nc\ne\n"                       # "b\nx\nc" occurs twice
    after = "a\nb\nx\nc\nd\nb\ny\nc\ne\n"
    (h,) = patch_hunks(_diff(text, after, "m.py"))
    assert edit_strings(h) == ("x", "y")                              # without the file: the changed line
    assert edit_strings(h, text) == ("d\nb\nx\nc\ne", "d\nb\ny\nc\ne")  # "x", then "b\nx\nc" occur twice
    script = demo_script(_task(_diff(text, after, "m.py")), {"m.py": text})
    edit = next(parse_action(x).args for _, x in script if "edit_file" in x)
    assert text.count(edit["old_str"]) == 1 and text.replace(edit["old_str"], edit["new_str"]) == after


def test_chunks_never_hold_two_tasks_with_one_prompt():
    tasks = [Task(id=f"t{i}", prompt=p, files={}, test_cmd="true") for i, p in enumerate("aabac")]
    chunks = prompt_chunks(tasks, 2)
    assert [[t.id for t in ch] for ch in chunks] == [["t0", "t2"], ["t1", "t4"], ["t3"]]   # first chunk with room


def _cfg():
    c = sibling_config(str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "x.py"), "swe_real.py")
    return ml_collections.ConfigDict(c.to_dict())


def test_demo_rows_round_trip_under_their_key_and_only_under_it(tmp_path):
    c, t = _cfg(), _task(_diff(BEFORE, BEFORE.replace("x + 1", "x - 1"), "pkg/m.py"))
    rows = [(np.arange(5), np.array([0, 0, 1, 1, 0.0])), (np.arange(3) + 7, np.ones(3))]
    key = demo_key([t], c)
    save_rows(tmp_path / "d.npz", rows, key, DemoReport(tried=1, kept=1, rows=2))
    got, rec = load_rows(tmp_path / "d.npz", key)
    assert [(a.tolist(), m.tolist()) for a, m in got] == [(a.tolist(), m.tolist()) for a, m in rows]
    assert rec["demos/kept"] == 1 and rec["demos/rows"] == 2
    assert load_rows(tmp_path / "missing.npz", key) is None
    c.agent.max_turns += 1                                 # another agent builds other rows: not reused
    assert demo_key([t], c) != key and load_rows(tmp_path / "d.npz", demo_key([t], c)) is None
    other = _task(t.metadata["patch"], tests=("tests/test_m.py::test_f",))
    assert demo_key([other], _cfg()) != key


def test_a_changed_demonstrator_builds_its_rows_again(monkeypatch):
    c, t = _cfg(), _task(_diff(BEFORE, BEFORE.replace("x + 1", "x - 1"), "pkg/m.py"))
    key = demo_key([t], c)
    monkeypatch.setattr(swe_demos, "READ_RADIUS", swe_demos.READ_RADIUS + 1)      # other prints, other rows
    assert demo_key([t], c) != key


def test_agent_turns_are_the_loss_masked_runs_with_their_contexts():
    rows = [(np.arange(10), np.array([0, 0, 1, 1, 0, 0, 0, 1, 1, 1])), (np.arange(4) + 20, np.array([1, 0, 0, 0]))]
    got = [(a.tolist(), b.tolist()) for a, b in agent_turns(rows, 10)]
    assert got == [([0, 1], [2, 3]), ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9]), ([], [20])]
    assert len(agent_turns(rows, 2)) == 2


def test_turn_kinds():
    fmt = tool_format("horizon")
    assert turn_kind(fmt, render_call("read_file", {"path": "/workspace/a.py"})) == "call:read_file"
    assert turn_kind(fmt, render_final("done")) == "final"
    assert turn_kind(fmt, render_summary("kept: a, b", thinking="t")) == "summary"
    assert turn_kind(fmt, "<function=read_file>\n<parameter=path>/workspace/a.py") == "malformed"   # never closed


def test_turn_probe_compares_each_decode_with_its_own_turn(monkeypatch):
    """The probe decodes contexts sorted by length and must score each decode against its own
    turn: a fake sampler that answers each context with its demonstrated turn scores 1, and one
    that answers a fixed malformed turn scores 0."""
    c = _cfg()
    texts = [render_call("read_file", {"path": f"/workspace/f{i}.py"}) if i % 2 else render_final(f"done {i}")
             for i in range(4)]
    texts.append(render_call("edit_file", {"command": "str_replace", "path": "/workspace/f.py", "old_str": "a = 1",
                                           "new_str": "a = 2"}))
    ctx = [np.arange(50 - 9 * i) % 200 for i in range(5)]           # longest first: the probe reorders them
    turns = [(x, np.asarray(TOK.encode(t))) for x, t in zip(ctx, texts)]
    answer = {len(x): np.asarray(TOK.encode(t)) for x, t in zip(ctx, texts)}

    def fake(params, prompts, key, *, cfg, max_new_tokens, sampling):
        assert sampling.temperature == 0.0 and max_new_tokens <= int(cfg.model.max_seq_len) - max(map(len, prompts))
        return types.SimpleNamespace(tokens=[answer[len(p)] for p in prompts])
    monkeypatch.setattr(sampler, "generate", fake)
    assert swe_demos.turn_probe(None, turns, c, TOK, batch=2) == dict(
        turn_wellformed=1.0, turn_same_kind=1.0, turn_exact=1.0, edit_wellformed=1.0, edit_old_exact=1.0)
    answer[len(ctx[4])] = np.asarray(TOK.encode(texts[4].replace("a = 1", "a = 3")))   # well-formed, wrong copy
    assert swe_demos.turn_probe(None, turns, c, TOK, batch=2) == dict(
        turn_wellformed=1.0, turn_same_kind=1.0, turn_exact=0.8, edit_wellformed=1.0, edit_old_exact=0.0)
    answer = {k: np.asarray(TOK.encode("<function=read_file>")) for k in answer}
    assert swe_demos.turn_probe(None, turns, c, TOK, batch=2) == dict(
        turn_wellformed=0.0, turn_same_kind=0.0, turn_exact=0.0, edit_wellformed=0.0, edit_old_exact=0.0)
