"""The shape of the house (CONTRIBUTING.md, docs/ARCHITECTURE.md): rules a reader relies on that no
import-linter contract states. Each test reads source text only; nothing is imported or run."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "horizon"
# Where a reader follows a citation: code, configs, drivers, tests and the docs that describe them.
# docs/PERF.md and docs/RESULTS.md are dated records (they name the issues and dates they measured).
CITING = [ROOT / d for d in ("src", "configs", "experiments", "benchmarks", "tests", "pallas_kernels", "envs")]
CITING_DOCS = [ROOT / f for f in ("README.md", "CONTRIBUTING.md", "docs/ARCHITECTURE.md", "docs/KERNELS.md",
                                  "docs/INFERENCE.md", "docs/SCALING.md", "docs/QUICKSTART.md", "docs/SANDBOX.md")]
MAX_FILE_LINES = 600
LONG_FILE_EXCEPTIONS: set[str] = set()
MAX_FUNCTION_LINES = 80
LONG_FUNCTION_MARK = "# long function:"             # a comment in the body that says why


def _py_files(*dirs):
    return sorted(p for d in dirs for p in d.rglob("*.py") if "__pycache__" not in p.parts and ".build" not in p.parts)


def _text_files():
    files = [p for p in _py_files(*CITING)] + [p for p in CITING_DOCS if p.exists()]
    return [p for p in files if p.name != pathlib.Path(__file__).name]


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_horizon_import_inside_a_function():
    """Layers import downward at module top; an import inside a function would hide a loop."""
    found = []
    for p in _py_files(SRC):
        for fn in _functions(ast.parse(p.read_text())):
            for n in ast.walk(fn):
                mods = ([n.module or ""] if isinstance(n, ast.ImportFrom) and n.level == 0 else
                        [a.name for a in n.names] if isinstance(n, ast.Import) else [])
                if isinstance(n, ast.ImportFrom) and n.level > 0:
                    mods = ["horizon (relative)"]
                if any(m == "horizon" or m.startswith("horizon") for m in mods):
                    found.append(f"{p.relative_to(ROOT)}:{n.lineno} in {fn.name}()")
    assert not found, "horizon imports inside functions:\n" + "\n".join(found)


def test_library_files_hold_one_concept():
    too_long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _py_files(SRC)
                if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
                and str(p.relative_to(SRC)) not in LONG_FILE_EXCEPTIONS]
    assert not too_long, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(too_long)


def test_long_functions_say_why():
    found = []
    for p in _py_files(SRC):
        lines = p.read_text().splitlines()
        for fn in _functions(ast.parse("\n".join(lines))):
            n = fn.end_lineno - fn.lineno + 1
            body = "\n".join(lines[fn.lineno - 1:fn.end_lineno])
            if n > MAX_FUNCTION_LINES and LONG_FUNCTION_MARK not in body:
                found.append(f"{p.relative_to(ROOT)}:{fn.lineno} {fn.name}: {n} lines")
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines without a '{LONG_FUNCTION_MARK}' comment:\n" + \
        "\n".join(found)


def test_experiments_stay_thin():
    fat = [f"{p.name}: {n}" for p in sorted((ROOT / "experiments").glob("*.py"))
           if (n := len(p.read_text().splitlines())) >= 150]
    assert not fat, f"experiments/ drivers of 150 lines or more: {fat}"


OUTSIDE = re.compile(r"(?<![\w/.])SPEC[ ]§|shared[/]SPEC|\b[Ii]ssues? #?[0-9]+|notes/\w+_CONTRACT\.md")


def test_code_cites_the_repository_not_outside_files_or_issues():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for p in _text_files()
             for i, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "citations of the outside spec, notes or issue numbers:\n" + "\n".join(found)


def _spec_headings():
    heads = set()
    for line in (ROOT / "docs" / "SPEC.md").read_text().splitlines():
        if m := re.match(r"#{2,4}\s+(\d+(?:\.\d+)*)\.?\s", line):
            heads.add(m.group(1))
    return heads


CITATION = re.compile(r"docs/SPEC\.md\s+((?:§\d+(?:\.\d+)*(?:\s*(?:,|and|/)\s*)?)+)")


def test_every_cited_spec_section_is_a_heading_of_docs_spec():
    heads = _spec_headings()
    assert {"1", "2", "3", "4", "4.1", "5", "6", "7", "8"} <= heads
    cited, missing = 0, []
    for p in _text_files() + [ROOT / "docs" / "SPEC.md"]:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            for m in CITATION.finditer(line):
                for sec in re.findall(r"§(\d+(?:\.\d+)*)", m.group(1)):
                    cited += 1
                    if sec not in heads:
                        missing.append(f"{p.relative_to(ROOT)}:{i}: docs/SPEC.md §{sec}")
    assert cited > 100, "the code is expected to cite docs/SPEC.md throughout"
    assert not missing, "citations of sections docs/SPEC.md does not have:\n" + "\n".join(missing)


# Paths into the repository as prose names them: a top-level folder, then a concrete file name (a
# task's own tests/test.sh is a path inside a task, not the repository; NAME-style parts are placeholders).
PATH = re.compile(r"(?<![\w./-])((?:docs|configs|experiments|benchmarks|envs|pallas_kernels|src/horizon)"
                  r"/[\w./-]*\.(?:py|md|sh|toml|jsonl|json|txt)|tests/[\w./-]*\.py)")
PLACEHOLDER = re.compile(r"/(?:[A-Z]+|x)(?:\.|/)")


@pytest.mark.parametrize("folder", ["src", "configs", "experiments", "benchmarks", "pallas_kernels", "envs", "docs"])
def test_every_path_a_docstring_or_comment_names_exists(folder):
    base = ROOT / folder
    files = _py_files(base) if folder != "docs" else [p for p in CITING_DOCS if p.exists()]
    missing = []
    for p in files:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            for path in PATH.findall(line):
                if not PLACEHOLDER.search(path) and not (ROOT / path.rstrip(".")).exists():
                    missing.append(f"{p.relative_to(ROOT)}:{i}: {path}")
    assert not missing, "paths named that do not exist:\n" + "\n".join(missing)


# Dotted names that are not modules: the kernels' entry-point group (setup.cfg), Docker labels, and the
# module path of older checkouts that benchmarks/generate_at_tree.py drives.
NOT_MODULES = {"horizon.quant_kernels", "horizon.test_run", "horizon.sandbox.kind", "horizon.sandbox.task_id",
               "horizon.rl.rollout.sampler"}
DOTTED = re.compile(r"(?<![\w.])horizon(?:\.[A-Za-z_]\w*)+")


def _module_file(mod: str) -> pathlib.Path | None:
    p = ROOT / "src" / mod.replace(".", "/")
    return p.with_suffix(".py") if p.with_suffix(".py").exists() else (p / "__init__.py" if p.is_dir() else None)


def _top_level_names(f: pathlib.Path) -> set[str]:
    names = set()
    for n in ast.parse(f.read_text()).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names |= {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names


def test_every_dotted_horizon_name_resolves():
    """`horizon.a.b` / `horizon.a.b.NAME` in code, configs and docs name a module (and a top-level
    name of it): a moved module leaves no dangling reference behind."""
    bad, names = [], {}
    for p in _text_files() + [ROOT / "setup.cfg"]:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            for ref in DOTTED.findall(line):
                if ref in NOT_MODULES:
                    continue
                parts = ref.split(".")
                k = next((k for k in range(len(parts), 0, -1) if _module_file(".".join(parts[:k]))), 0)
                f = _module_file(".".join(parts[:k])) if k else None
                if f is None or (k < len(parts) and parts[k] not in names.setdefault(f, _top_level_names(f))):
                    bad.append(f"{p.relative_to(ROOT)}:{i}: {ref}")
    assert not bad, "dotted names that resolve to no module or top-level name:\n" + "\n".join(bad)
