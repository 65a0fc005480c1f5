"""File helpers every layer may use (utils sits below all of them)."""

from __future__ import annotations

import os
import pathlib
import threading

TMP_MARK = ".tmp."      # in every temporary name `atomic_write_bytes` uses (readers may skip such files)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """tmp file + fsync + rename: readers see the old file or the new one, never a torn one (the tmp
    name is per process and thread: the weight publisher writes from a thread pool). The one atomic
    write of the repo (RL group / scheduler / weight stores, checkpoint manifests)."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}.{threading.get_ident()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
