"""Config helpers: load sibling ml_collections config files, dump configs, check values.

Config files in `configs/` are plain Python files returning the *complete* `ConfigDict` a run
uses from `get_config()` (no run-time overlay: an override of any field is the value the run
uses). They are loaded by path (as `ml_collections.config_flags` does), so a config that
extends another one loads it through `sibling_config` instead of a package import. Command
lines are parsed by `horizon.utils.cli`; every layer checks its own section with the helpers
below and raises `ConfigError`, which a driver turns into one line on stderr and exit code 2.
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


def deep_merge(dst: ml_collections.ConfigDict, src: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Merge `src` into `dst` in place: nested ConfigDicts recursively, other values replaced."""
    for k, v in src.items():
        if isinstance(v, ml_collections.ConfigDict) and k in dst and isinstance(dst[k], ml_collections.ConfigDict):
            deep_merge(dst[k], v)
        else:
            dst[k] = v
    return dst


class ConfigError(ValueError):
    """A config value a run cannot use. The message is one line naming the field, the value and
    what is allowed (`horizon.utils.cli` prints it and exits 2 before any work starts)."""


def need(cond: bool, field: str, value: Any, allowed: str) -> None:
    """Raise `ConfigError("field=value: allowed")` unless `cond`."""
    if not cond:
        raise ConfigError(f"{field}={value!r}: {allowed}")


def need_int(section, name: str, prefix: str, lo: int | None = None, hi: int | None = None) -> int:
    """`section[name]` as an int in [lo, hi] (either bound optional); bools are not ints here."""
    v = section[name]
    field = f"{prefix}.{name}"
    need(isinstance(v, int) and not isinstance(v, bool), field, v, "must be an integer")
    if lo is not None or hi is not None:
        rng = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        need((lo is None or v >= lo) and (hi is None or v <= hi), field, v, f"must be in {rng}")
    return v


def need_float(section, name: str, prefix: str, lo: float | None = None, hi: float | None = None, *,
               lo_open: bool = False) -> float:
    """`section[name]` as a number in [lo, hi] (`lo_open`: (lo, hi])."""
    v = section[name]
    field = f"{prefix}.{name}"
    need(isinstance(v, (int, float)) and not isinstance(v, bool), field, v, "must be a number")
    ok_lo = lo is None or (v > lo if lo_open else v >= lo)
    ok_hi = hi is None or v <= hi
    rng = f"{'(' if lo_open else '['}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
    need(ok_lo and ok_hi, field, v, f"must be in {rng}")
    return float(v)


def need_choice(section, name: str, prefix: str, choices) -> str:
    v = section[name]
    need(v in tuple(choices), f"{prefix}.{name}", v, f"must be one of {tuple(choices)}")
    return v
