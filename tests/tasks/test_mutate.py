"""AST bug injection (horizon.taskgen.mutate): every kind, determinism, inverse diffs (no Docker)."""

import subprocess

import pytest

from horizon.taskgen import mutate

MODULE = '''"""A small module: 10 kinds of mutation find a site here."""


def clamp(x, lo, hi):
    # keep x within [lo, hi]
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def window(items, n=2):
    out = []
    for i in range(len(items) - 1):
        if items[i] == items[i + 1] and n > 0:
            continue
        out.append(items[i:i + n])
    return out


def scale(values, factor=1.5, strict=True):
    total = 0
    for v in values:
        total += v * factor
    return divmod(total, 3) if strict else total
'''


def test_every_kind_has_candidates():
    cands = mutate.candidates(MODULE, "pkg/mod.py")
    assert {m.kind for m in cands} == set(mutate.KINDS)
    assert len({m.source for m in cands}) == len(cands)            # no duplicates
    for m in cands:
        compile(m.source, m.path, "exec")
        assert m.source != MODULE and m.original == MODULE
        assert m.gold_patch.count("@@ -") == 1 and m.gold_patch.startswith("diff --git a/pkg/mod.py b/pkg/mod.py\n")
        assert "# keep x within [lo, hi]" in m.source                  # edits are local: comments survive


@pytest.mark.parametrize("kind, line, desc, function", [
    ("comparison_swap", 6, "'<' -> '<='", "clamp"),
    ("operator_swap", 15, "'-' -> '+'", "window"),
    ("off_by_one", 15, "1 -> 2", "window"),
    ("remove_return", 7, "return removed", "clamp"),
    ("swap_arguments", 26, "(total, 3) -> (3, total)", "scale"),
    ("change_constant", 22, "1.5 -> 3.0", "scale"),
])
def test_locations(kind, line, desc, function):
    got = [m for m in mutate.candidates(MODULE, kinds=[kind]) if m.line == line and m.description == desc]
    assert len(got) == 1, [(m.line, m.description) for m in mutate.candidates(MODULE, kinds=[kind])]
    assert got[0].function == function


def test_examples():
    by = {(m.kind, m.line, m.description): m.source for m in mutate.candidates(MODULE)}
    assert "    if x <= lo:\n" in by[("comparison_swap", 6, "'<' -> '<='")]
    assert "    if not (x < lo):\n" in by[("invert_condition", 6, "condition -> 'not (x < lo)'")]
    assert "        if items[i] == items[i + 1] or n > 0:\n" in by[("boolean_swap", 16, "'and' -> 'or'")]
    assert "        total -= v * factor\n" in by[("operator_swap", 25, "+= -> -=")]
    removed = by[("remove_branch", 6, "if-branch removed")]
    assert "if x < lo" not in removed and "    if x > hi:\n        return hi\n" in removed
    assert "out.append" not in by[("remove_statement", 18, "call statement removed")]


def test_deterministic_by_seed():
    a = [mutate.mutate(MODULE, s, "mod.py") for s in range(20)]
    b = [mutate.mutate(MODULE, s, "mod.py") for s in range(20)]
    assert a == b and len({m.kind for m in a}) >= 6
    picked = mutate.sample(MODULE, 12, seed=3)
    assert len({m.kind for m in picked}) == 10 and len({m.source for m in picked}) == 12
    assert mutate.sample(MODULE, 12, seed=3) == picked


def test_gold_patch_is_the_inverse(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    target = tmp_path / "pkg" / "mod.py"
    target.parent.mkdir()
    for m in mutate.sample(MODULE, 10, seed=0, path="pkg/mod.py"):
        target.write_text(MODULE)
        (tmp_path / "bug.diff").write_text(m.bug_patch)
        subprocess.run(["git", "-C", str(tmp_path), "apply", "bug.diff"], check=True)
        assert target.read_text() == m.source
        (tmp_path / "gold.diff").write_text(m.gold_patch)
        subprocess.run(["git", "-C", str(tmp_path), "apply", "gold.diff"], check=True)
        assert target.read_text() == MODULE, m.kind


def test_no_trailing_newline_and_unicode():
    src = "def f(s):\n    return s + 'é' if len(s) > 1 else s"
    for m in mutate.candidates(src, "u.py"):
        assert "\\ No newline at end of file" in m.gold_patch
    assert any(m.kind == "comparison_swap" and "len(s) >= 1" in m.source for m in mutate.candidates(src))


def test_errors():
    with pytest.raises(mutate.MutationError, match="bad.py: does not parse"):
        mutate.candidates("def f(:\n", "bad.py")
    with pytest.raises(mutate.MutationError, match="no mutation"):
        mutate.mutate("x = 'a'\n", 0)
    with pytest.raises(mutate.MutationError, match="unknown mutation kind"):
        mutate.candidates(MODULE, kinds=["nope"])


def _apply_patch(tmp_path, before, patch, path="pkg/mod.py"):
    f = tmp_path / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(before)
    (tmp_path / "p.diff").write_text(patch)
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, capture_output=True)
    return f.read_text()


def test_feature_deletion_keeps_docstring_and_inverts(tmp_path):
    src = MODULE.replace("def scale(values, factor=1.5, strict=True):\n",
                         'def scale(values, factor=1.5, strict=True):\n    """Sum of values times factor."""\n')
    got = {m.function: m for m in mutate.feature_deletions(src, "pkg/mod.py")}
    assert set(got) == {"clamp", "window", "scale"} and all(m.kind == mutate.FEATURE_KIND for m in got.values())
    m = got["scale"]
    assert '    """Sum of values times factor."""\n    raise NotImplementedError\n' in m.source
    assert "total += v * factor" not in m.source and "def clamp(x, lo, hi):\n    # keep x" in m.source
    compile(m.source, "m", "exec")
    assert _apply_patch(tmp_path, m.source, m.gold_patch) == src
    assert mutate.function_key(src, m.line + 3) == ("scale", m.line)


def test_combine_applies_all_and_inverts(tmp_path):
    ms = {m.description: m for m in mutate.candidates(MODULE, "pkg/mod.py")}
    a, b = ms["'<' -> '<='"], ms["'and' -> 'or'"]
    c = mutate.combine([a, b])
    assert c.kind == mutate.COMBINED_KIND and "x <= lo" in c.source and "] or n > 0" in c.source
    assert c.source.count("\n") == MODULE.count("\n") and c.bug_patch.count("@@ ") == 2
    assert _apply_patch(tmp_path, c.source, c.gold_patch) == MODULE
    same_line = [m for m in ms.values() if m.line == a.line and m is not a][0]
    with pytest.raises(mutate.MutationError):
        mutate.combine([a, same_line])
    with pytest.raises(mutate.MutationError):
        mutate.combine([a])


def test_sample_is_lazy_subset_of_candidates():
    every = {(m.kind, m.source) for m in mutate.candidates(MODULE, "m.py")}
    got = mutate.sample(MODULE, 7, 3, "m.py")
    assert len(got) == 7 and {(m.kind, m.source) for m in got} <= every
    assert [m.source for m in mutate.sample(MODULE, 7, 3, "m.py")] == [m.source for m in got]
