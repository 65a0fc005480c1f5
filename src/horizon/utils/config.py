"""Config helpers: load sibling ml_collections config files and dump configs.

Config files in `configs/` are plain Python files returning a `ConfigDict` from
`get_config()`. They are loaded by path (as `ml_collections.config_flags` does), so a
config that extends another one loads it through `sibling_config` instead of a
package import.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
from typing import Any

import ml_collections


def load_config_file(path: str | pathlib.Path, arg: str | None = None) -> ml_collections.ConfigDict:
    """Import `path` and return its `get_config()` (or `get_config(arg)`)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"_horizon_cfg_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise AttributeError(f"{path} defines no get_config()")
    return module.get_config(arg) if arg is not None else module.get_config()


def sibling_config(this_file: str, name: str) -> ml_collections.ConfigDict:
    """Load `name` (e.g. "tiny.py") from the same folder as `this_file`."""
    return load_config_file(pathlib.Path(this_file).with_name(name))


def config_to_dict(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    return json.loads(cfg.to_json_best_effort())


def dump_config(cfg: ml_collections.ConfigDict, path: str | pathlib.Path) -> None:
    """Write the resolved config as JSON (every run dir gets one, for reproducibility)."""
    pathlib.Path(path).write_text(json.dumps(config_to_dict(cfg), indent=2, sort_keys=True))


def apply_overrides(cfg: ml_collections.ConfigDict, items: list[str]) -> ml_collections.ConfigDict:
    """Apply `--set a.b=VALUE` overrides in place (VALUE parsed as JSON when it parses).

    Unknown fields raise (a typo must not silently run the default); a JSON list assigned to a
    tuple-valued field stays a tuple.
    """
    for item in items:
        path, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set needs a.b=VALUE, got {item!r}")
        *parents, leaf = path.split(".")
        node = cfg
        for name in parents:
            node = node[name]
        if leaf not in node:
            raise KeyError(f"unknown config field {path!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node[leaf] = tuple(value) if isinstance(value, list) and isinstance(node[leaf], tuple) else value
    return cfg


def deep_merge(dst: ml_collections.ConfigDict, src: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Merge `src` into `dst` in place: nested ConfigDicts recursively, other values replaced."""
    for k, v in src.items():
        if isinstance(v, ml_collections.ConfigDict) and k in dst and isinstance(dst[k], ml_collections.ConfigDict):
            deep_merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def merge_experiment(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Apply an experiment block's overrides of the shared sections (`exp.model`, `exp.agent`,
    `exp.rl` -> c.model / c.agent / c.rl; configs/rl_tiny.py) and size the RL schedule to
    `exp.steps`. Idempotent."""
    for name in ("model", "agent", "rl"):
        if name in c.exp:
            deep_merge(c[name], c.exp[name])
    c.rl.optim.steps = int(c.exp.steps)
    c.rl.optim.warmup_steps = min(int(c.rl.optim.warmup_steps), max(0, int(c.exp.steps) - 1))
    return c
