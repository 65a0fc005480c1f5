"""One command line for every driver: ml_collections' `--config=FILE[:ARG] --config.a.b=VALUE` (docs/SPEC.md §7).

Parsing is ml_collections' own `config_flags` on a fresh absl `FlagValues` per call (so a driver's
`main(argv)` can run more than once in one process, e.g. from tests). An override must name an
existing field and is parsed by that field's type: ints stay ints, floats accept `1e-3`, booleans
`true`/`false`, tuples `'(1, 2)'` or a repeated flag. Config files return the complete config the
run uses, so an override is the last word on its field.

`load(argv, default=..., validate=...)` is a driver's first line: parse, then the driver's
`validate(config)`, and only then does the driver create a directory, a sandbox or a compile. Bad
input — an unknown field, a value of the wrong type, a missing config file, a stray positional
argument, a value `validate` rejects (`ConfigError`) — exits with status 2 and one line on stderr.
`-h`/`--help` prints the driver's usage line and the config's fields with their values.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable
from typing import NoReturn

import ml_collections
from absl import flags
from ml_collections import config_flags

from horizon.utils.config import ConfigError, load_config_file
from horizon.utils.tracking import TrackingConfig

USAGE = "usage: {prog} --config=FILE [--config.a.b=VALUE ...]"


def fail(message: str, prog: str = "") -> NoReturn:
    """One line on stderr, exit code 2 (bad input, nothing started)."""
    first = " ".join(str(message).split("\n")[0].split())
    print(f"{prog + ': ' if prog else ''}error: {first}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _config_arg(argv: list[str]) -> str | None:
    """The value of the last `--config` (absl's rule: a later flag wins), or None."""
    found = None
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            found = a.split("=", 1)[1]
        elif a == "--config":
            found = argv[i + 1] if i + 1 < len(argv) else ""
    return found


def parse(argv: list[str] | None, *, default: str) -> ml_collections.ConfigDict:
    """The config named by `--config` (else `default`) with every `--config.a.b=v` applied.

    Raises `ConfigError` (one-line message) on a missing file, an unknown field, a value of the
    wrong type or an argument that is not a config flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    path = _config_arg(argv)
    if path is None:
        argv = [f"--config={default}"] + argv
        path = default
    if not path:
        raise ConfigError("--config needs a file: --config=configs/NAME.py")
    file = pathlib.Path(path.split(":", 1)[0])
    if not file.is_file():
        raise ConfigError(f"config file not found: {file}")
    fv = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, "config file", flag_values=fv, lock_config=True,
                                             sys_argv=["prog"] + argv)
    try:
        rest = fv(["prog"] + argv)
    except flags.Error as e:
        raise ConfigError(_flag_error_text(e)) from None
    except OSError as e:                              # the config file failed to load
        raise ConfigError(" ".join(str(e).split())) from None
    except (KeyError, AttributeError) as e:          # config_flags walking a path through a missing section
        fresh = load_config_file(*path.split(":", 1))
        bad = next((a.split("=", 1)[0] for a in argv if a.startswith("--config.") and _missing(fresh, a)), None)
        raise ConfigError(f"unknown config field {bad or ' '.join(str(e).split())} (not in the config file; "
                          "see --help for the fields)") from None
    if len(rest) > 1:
        raise ConfigError(f"unexpected argument {rest[1]!r}: overrides are --config.a.b=VALUE")
    return holder.value


def overrides(argv: list[str]) -> dict[str, str]:
    """{"a.b": "v"} of `--config.a.b=v` arguments (values unparsed: the config that receives them parses
    them); `ConfigError` on any other argument (a wrapper's pass-through, experiments/sweep.py)."""
    out = {}
    for a in argv:
        if not (a.startswith("--config.") and "=" in a):
            raise ConfigError(f"unexpected argument {a!r}: overrides are --config.a.b=VALUE")
        k, v = a[len("--config."):].split("=", 1)
        out[k] = v
    return out


def _missing(config: ml_collections.ConfigDict, arg: str) -> bool:
    """Whether `--config.a.b=v` names a path that `config` lacks."""
    node = config
    for part in arg.split("=", 1)[0][len("--config."):].split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return True
        node = node[part]
    return False


def _flag_error_text(e: Exception) -> str:
    text = " ".join(str(e).split())
    if "Unknown command line flag 'config." in text:
        name = text.split("'")[1]
        return f"unknown config field --{name} (not in the config file; see --help for the fields)"
    return text


def field_lines(c: ml_collections.ConfigDict, prefix: str = "config") -> list[str]:
    """`--config.a.b=VALUE` for every leaf of `c` (the --help listing)."""
    out = []
    for k, v in c.items():
        if isinstance(v, ml_collections.ConfigDict):
            out += field_lines(v, f"{prefix}.{k}")
        else:
            out.append(f"  --{prefix}.{k}={v!r}")
    return out


def load(argv: list[str] | None, *, default: str, validate: Callable[[ml_collections.ConfigDict], None],
         doc: str = "", prog: str = "", derive: Callable[[ml_collections.ConfigDict], None] | None = None
         ) -> ml_collections.ConfigDict:
    """`parse`, then `derive` (fields computed from others, e.g. `horizon.model.hf.apply_init_from`), then
    `validate`; on bad input print one line and exit 2 (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or pathlib.Path(sys.argv[0]).name
    if any(a in ("-h", "--help", "-help", "--helpfull") for a in argv):
        args = [a for a in argv if a not in ("-h", "--help", "-help", "--helpfull")]
        print(USAGE.format(prog=prog) + ("\n\n" + doc.strip() if doc else ""))
        try:
            c = parse(args, default=default)
            print("\nfields (current values):\n" + "\n".join(field_lines(c)))
        except ConfigError as e:
            fail(str(e), prog)
        raise SystemExit(0)
    try:
        c = parse(argv, default=default)
        if derive is not None:
            derive(c)
        validate(c)
        TrackingConfig.from_config(c).validate()       # exp.tensorboard / text_every / wandb (every driver)
    except ConfigError as e:
        fail(str(e), prog)
    return c
