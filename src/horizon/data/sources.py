"""Local text/code corpora and the deterministic train / held-out split (docs/SPEC.md §8).

Files are found under `cfg.data.sources` (directories relative to `cfg.data.root`, the
repo root when empty) by extension. A file's split is a pure function of its relative
path (SHA-256 hash), so adding a file never moves other files between splits.
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Sequence

import grain
import ml_collections

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
SPLITS = ("train", "heldout")
_SKIP_DIRS = {".git", ".venv", "__pycache__", "node_modules", ".pytest_cache", "runs"}


def corpus_root(data_cfg: ml_collections.ConfigDict) -> pathlib.Path:
    root = data_cfg.get("root", "") or ""
    return pathlib.Path(root).expanduser().resolve() if root else REPO_ROOT


def heldout_score(rel_path: str) -> float:
    """Uniform in [0, 1) from the path's SHA-256: `score < heldout_fraction` = held out."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def list_files(root: pathlib.Path, sources: Sequence[str], extensions: Sequence[str]) -> list[str]:
    """Sorted relative paths (posix) of files under `root/src` for each source dir (or file)."""
    exts = tuple(extensions)
    found: set[str] = set()
    for src in sources:
        base = (root / src).resolve()
        if not base.exists():
            raise FileNotFoundError(f"data source {src!r} not found under {root}")
        candidates = [base] if base.is_file() else base.rglob("*")
        for p in candidates:
            if not p.is_file() or not p.name.endswith(exts):
                continue
            rel = p.relative_to(root)
            if any(part in _SKIP_DIRS for part in rel.parts):
                continue
            found.add(rel.as_posix())
    return sorted(found)


def split_files(files: Sequence[str], heldout_fraction: float, split: str) -> list[str]:
    """Files of `split` ("train" | "heldout"), by path hash."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    held = [f for f in files if heldout_score(f) < heldout_fraction]
    return held if split == "heldout" else [f for f in files if heldout_score(f) >= heldout_fraction]


def file_source(data_cfg: ml_collections.ConfigDict, split: str) -> grain.MapDataset:
    """A grain MapDataset of `(rel_path, text)` for one split, in sorted path order."""
    root = corpus_root(data_cfg)
    files = split_files(list_files(root, data_cfg.sources, data_cfg.extensions),
                        data_cfg.heldout_fraction, split)
    if not files:
        raise ValueError(
            f"split {split!r} is empty: no {list(data_cfg.extensions)} files under "
            f"{[str(root / s) for s in data_cfg.sources]} with heldout_fraction={data_cfg.heldout_fraction}")

    def read(rel: str) -> tuple[str, str]:
        return rel, (root / rel).read_text(encoding="utf-8", errors="replace")

    return grain.MapDataset.source(files).map(read)
