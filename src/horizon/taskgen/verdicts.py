"""A candidate's validation verdict, its rule and its cache (docs/SPEC.md §7; `generate` docstring,
steps 2-3).

A candidate is kept iff its run finished, every selected stable test is in the report, at least
one fails and the others pass (`verdict`). Verdicts are cached on the host under
``cache/<key>.json`` beside the repository, keyed by `candidate_key`, so a rebuild validates only
new candidates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re

from horizon.taskgen import mutate, repos
from horizon.tasks import swebench

GEN_FORMAT = "4"                  # bump when validation or instance layout changes (invalidates the cache)
MAX_MESSAGE_CHARS = 300
_FAIL_LINE_RE = re.compile(r"^(FAILED|ERROR) (\S+?)(?: - (.*))?$")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The validation outcome of one candidate."""
    status: str                    # "kept" | "no_failure" | "missing" | "timeout"
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    messages: dict                 # failing test id -> assertion message (pytest's short summary)


def candidate_key(tree: str, m: mutate.Mutation) -> str:
    """Cache key of a candidate: sha256 of the repository tree hash, path, mutated source, format."""
    h = hashlib.sha256()
    for part in (GEN_FORMAT, tree, m.path, m.source):
        h.update(part.encode("utf-8") + b"\0")
    return h.hexdigest()


def failure_messages(report: str) -> dict[str, str]:
    """Failing test id -> its short-summary message (``FAILED id - msg``) from a ``-rA`` report."""
    out = {}
    for line in report.splitlines():
        m = _FAIL_LINE_RE.match(line.rstrip())
        if m and m.group(2) not in out:
            out[m.group(2)] = (m.group(3) or m.group(1).lower()).strip()[:MAX_MESSAGE_CHARS]
    return out


def verdict(statuses: dict[str, str], stable, timed_out: bool, messages: dict | None = None) -> Verdict:
    """Kept iff not timed out, no stable test missing, >= 1 stable test failing (the others pass)."""
    stable = list(stable)
    if timed_out:
        return Verdict("timeout", (), (), {})
    if any(t not in statuses for t in stable):
        return Verdict("missing", (), (), {})
    f2p = tuple(t for t in stable if statuses[t] not in swebench.PASS_STATUSES)
    p2p = tuple(t for t in stable if statuses[t] in swebench.PASS_STATUSES)
    if not f2p:
        return Verdict("no_failure", (), p2p, {})
    msgs = {t: (messages or {}).get(t, statuses[t].lower()) for t in f2p}
    return Verdict("kept", f2p, p2p, msgs)


def cache_path(root: str | os.PathLike | None, spec: repos.RepoSpec, key: str) -> pathlib.Path:
    """Where the verdict of candidate `key` is cached (`root`: the build directory)."""
    return repos.repo_dir(spec, root) / "cache" / f"{key}.json"


def load_cached(root, spec: repos.RepoSpec, key: str) -> Verdict | None:
    """The cached verdict of candidate `key`, or None."""
    p = cache_path(root, spec, key)
    if not p.is_file():
        return None
    d = json.loads(p.read_text())
    return Verdict(d["status"], tuple(d["fail_to_pass"]), tuple(d["pass_to_pass"]), d["messages"])


def store_cached(root, spec: repos.RepoSpec, key: str, v: Verdict) -> None:
    p = cache_path(root, spec, key)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dataclasses.asdict(v)) + "\n")
