"""Which mutations of a repository get validated (docs/SPEC.md §7; `generate` docstring, step 1).

Single-site mutations (`mutate.sample`, a seeded number per module, duplicates removed, in a
seeded order) and feature deletions are kept in order while some stable test can observe them
(`coverage.tests_for`); the others are skipped unrun. Combinations are drawn from the single-site
bugs already kept. Every choice is seeded, so a rebuild proposes the same candidates.
"""

from __future__ import annotations

import random
import zlib

from horizon.taskgen import coverage, mutate
from horizon.tasks.task import TaskError


def file_seed(seed: int, path: str) -> int:
    """The per-module sampling seed (stable across runs and Python versions)."""
    return (seed * 1_000_003 + zlib.crc32(path.encode("utf-8"))) % (2**31)


def candidate_mutations(files: dict[str, str], paths, n_candidates: int, seed: int, per_file: int = 0,
                        kinds=None) -> list[mutate.Mutation]:
    """Up to `n_candidates` distinct mutations of the modules `paths` of `files`; `per_file` 0 =
    enough per module to reach `n_candidates` twice over."""
    paths = list(paths)
    if not paths:
        raise TaskError("no mutable source files")
    per_file = per_file or max(2, -(-2 * n_candidates // len(paths)))
    seen, out = set(), []
    for p in paths:
        try:
            ms = mutate.sample(files[p], per_file, file_seed(seed, p), p, kinds)
        except mutate.MutationError:
            continue
        for m in ms:
            if (m.path, m.source) not in seen:
                seen.add((m.path, m.source))
                out.append(m)
    random.Random(seed).shuffle(out)
    return out[:n_candidates]


def feature_candidates(files: dict[str, str], paths, seed: int) -> list[mutate.Mutation]:
    """Every feature deletion (`mutate.feature_deletions`) of the modules `paths`, in a seeded order."""
    out = []
    for p in paths:
        try:
            out += mutate.feature_deletions(files[p], p)
        except mutate.MutationError:
            continue
    random.Random(seed).shuffle(out)
    return out


def first_covered(ms, n: int, cov: dict | None, baseline: dict) -> tuple[list[tuple], int]:
    """([(mutation, tests)] for the first `n` of `ms` some stable test observes, how many were
    skipped before them because none does)."""
    out, skipped = [], 0
    for m in ms:
        if len(out) >= n:
            break
        tests = coverage.tests_for(cov, baseline, m)
        if tests:
            out.append((m, tests))
        else:
            skipped += 1
    return out, skipped


def first_jobs(files: dict[str, str], paths, cov: dict | None, baseline: dict, *, n_candidates: int,
               n_features: int, seed: int) -> tuple[list[tuple], int]:
    """([(mutation, tests)], uncovered skipped): `n_candidates` single-site mutations then
    `n_features` feature deletions, each observed by some stable test."""
    pool = candidate_mutations(files, paths, 3 * n_candidates, seed) if n_candidates else []
    jobs, uncovered = first_covered(pool, n_candidates, cov, baseline)
    if n_features:
        feats, skipped = first_covered(feature_candidates(files, paths, seed + 1), n_features, cov, baseline)
        jobs, uncovered = jobs + feats, uncovered + skipped
    return jobs, uncovered


def combinations(kept: list[mutate.Mutation], n: int, size: int, seed: int) -> list[mutate.Mutation]:
    """Up to `n` distinct `mutate.combine`s of `size` kept single-site bugs of one module, seeded."""
    rng = random.Random(seed)
    by_path: dict[str, list[mutate.Mutation]] = {}
    for m in kept:
        if m.kind in mutate.KINDS:
            by_path.setdefault(m.path, []).append(m)
    pools = [ms for _, ms in sorted(by_path.items()) if len(ms) >= size]
    out, seen, tries = [], set(), 0
    while pools and len(out) < n and tries < 20 * max(n, 1):
        tries += 1
        ms = rng.choice(pools)
        try:
            c = mutate.combine(sorted(rng.sample(ms, size), key=lambda m: m.line))
        except mutate.MutationError:
            continue
        if c.source not in seen:
            seen.add(c.source)
            out.append(c)
    return out
