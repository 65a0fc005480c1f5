"""Which tests run which function of a repository: the coverage map (docs/SPEC.md §7; `generate`
docstring, step 0).

One suite run per repository image with the generator's pytest plugin (pytest_coverage_plugin.py
in this package, copied into the container as ``horizon_gen_plugin.py``) records, per test, the
functions under /workspace it called; `tests_for` turns that map into the stable tests that can
observe a mutation, so a candidate runs only those. The same plugin selects tests by id
(`plugin_command` with ``HORIZON_SELECT``).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import time

from horizon.sandbox.base import WORKSPACE
from horizon.sandbox.factory import open_sandbox
from horizon.taskgen import mutate, repos
from horizon.taskgen.verdicts import GEN_FORMAT
from horizon.tasks.task import TaskError

PLUGIN_FILE = "pytest_coverage_plugin.py"     # the plugin's source, beside this module
PLUGIN_NAME = "horizon_gen_plugin"            # its module name in the container (``-p horizon_gen_plugin``)
PLUGIN_DIR = "/tmp/horizon_gen"
PLUGIN_PATH = f"{PLUGIN_DIR}/{PLUGIN_NAME}.py"
SELECT_PATH = PLUGIN_DIR + "/select.txt"
COVERAGE_PATH = PLUGIN_DIR + "/coverage.json"
WIDE = "export COLUMNS=400; "      # pytest cuts summary messages at the terminal width (80 off a tty)


@functools.cache
def plugin_source() -> str:
    """The text of the generator's pytest plugin (shipped in this package as `PLUGIN_FILE`)."""
    return importlib.resources.files(__package__).joinpath(PLUGIN_FILE).read_text(encoding="utf-8")


def plugin_command(spec: repos.RepoSpec, env: str = "") -> str:
    """The suite command with the generator's plugin loaded (and `env` assignments for it)."""
    return (WIDE + f"export PYTHONPATH={PLUGIN_DIR}:$PYTHONPATH {env}; "
            + repos.suite_command(spec).replace("python3 -m pytest ", f"python3 -m pytest -p {PLUGIN_NAME} ", 1))


def install_plugin(sandbox) -> None:
    """Copy the plugin into `sandbox` (`PLUGIN_PATH`)."""
    sandbox.exec(f"mkdir -p {PLUGIN_DIR}", timeout=30.0, workdir="/")
    sandbox.write_file(PLUGIN_PATH, plugin_source())


def coverage_map(spec: repos.RepoSpec, baseline: dict, *, root=None, force: bool = False) -> dict:
    """{"path:first line": [stable test ids that ran that function]} for the mutable modules,
    from one traced suite run in the repository image; cached in ``coverage.json`` beside the
    baseline, keyed by the image labels. `tests_for` turns it into a mutation's relevant tests."""
    path = repos.repo_dir(spec, root) / "coverage.json"
    if not force and path.is_file():
        old = json.loads(path.read_text())
        if old.get("labels") == baseline["labels"] and old.get("format") == GEN_FORMAT:
            return old
    with open_sandbox("docker", spec.image, default_timeout=600.0, **repos.SANDBOX_LIMITS) as sb:
        install_plugin(sb)
        t0 = time.monotonic()
        r = sb.exec(plugin_command(spec, f"HORIZON_COVERAGE_OUT={COVERAGE_PATH}"), timeout=1800.0, workdir=WORKSPACE)
        try:
            per_test = json.loads(sb.read_file(COVERAGE_PATH))
        except (FileNotFoundError, json.JSONDecodeError) as e:
            raise TaskError(f"{spec.key}: the traced suite run wrote no coverage ({e}): {r.output[-300:]!r}") from e
        seconds = time.monotonic() - t0
    stable = set(baseline["stable"])
    funcs: dict[str, list[str]] = {}
    for t, keys in per_test.items():
        if t in stable:
            for k in keys:
                funcs.setdefault(k, []).append(t)
    out = {"labels": baseline["labels"], "format": GEN_FORMAT, "traced_s": round(seconds, 2),
           "untraced": sorted(stable - set(per_test)), "functions": {k: sorted(v) for k, v in sorted(funcs.items())}}
    path.write_text(json.dumps(out) + "\n")
    return out


def tests_for(cov: dict | None, baseline: dict, m: mutate.Mutation) -> list[str]:
    """The stable tests that can observe mutation `m` (all of them without a coverage map): those
    that ran a function `m` changes (its innermost enclosing function at each changed line;
    module- or class-level code runs at import, so every test), plus any test the trace missed.
    Empty = no test runs the mutated code (the candidate is skipped unrun, "uncovered")."""
    stable = list(baseline["stable"])
    if cov is None:
        return stable
    lines = sorted({ln for i1, i2, _ in mutate.changed_lines(m) for ln in range(i1 + 1, max(i1 + 1, i2) + 1)})
    got = set(cov.get("untraced", ()))
    for ln in lines or [m.line]:
        key = mutate.function_key(m.original, ln)
        if key is None:
            return stable
        got.update(cov["functions"].get(f"{m.path}:{key[1]}", ()))
    return [t for t in stable if t in got]
