"""The disk budget of a Docker sandbox (docs/SANDBOX.md "Disk"): with `disk_limit_mb > 0` a
watchdog measures the box's writable layer after every exec / write_file and every
`DISK_POLL_S` while a command runs; over budget it kills the user's processes and raises
`SandboxResourceError` (then on every exec / write_file until `prepare()`). Every file a command
writes is also capped at the budget (RLIMIT_FSIZE).

Measured from the host (a walk of the container's writable layer, method "host") where this
process can read it, else by `du` as the sandbox user over the places it can write, minus the
usage at creation (method "exec").
"""

from __future__ import annotations

import os
import re
import threading

from horizon.sandbox.base import SandboxError, SandboxInfraError, SandboxResourceError
from horizon.sandbox.scripts import DU_SCRIPT, KILL_USER_SCRIPT

DISK_POLL_S = 0.5             # disk watchdog period while an exec runs
_MiB = 1 << 20


class DiskBudget:
    """Mixin of `DockerSandbox`: its disk budget (module docstring). Needs `disk_limit_mb`,
    `_upper`, `_disk_baseline`, `_disk_exceeded` and `_run`."""

    def _fsize_kib(self) -> int:
        """`ulimit -f` (KiB) for the sandbox user's processes: one MiB above the budget, 0 = none."""
        return (self.disk_limit_mb + 1) * 1024 if self.disk_limit_mb else 0

    @staticmethod
    def _host_upper_dir(attrs: dict, method: str) -> str | None:
        """The writable layer's host directory when this process can walk it (`method` "auto" or
        "host"), else None."""
        if method == "exec" or not hasattr(os, "geteuid") or os.geteuid() != 0:
            return None
        upper = ((attrs.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir")
        if upper and os.path.isdir(upper):
            return upper
        if method == "host":
            raise SandboxInfraError(f"disk usage method 'host': writable layer {upper!r} is not readable here")
        return None

    def _du_bytes(self) -> int:
        code, out, _ = self._run(["bash", "-c", DU_SCRIPT], what="disk usage", timeout=60)
        m = re.match(rb"\s*(\d+)", out)
        if not m:
            raise SandboxInfraError(f"disk usage: cannot parse du output {out[-200:]!r} (exit {code})")
        return int(m.group(1)) * 1024

    def disk_usage_bytes(self) -> int:
        """Bytes the sandbox has written since it was created (its writable layer; what the
        disk budget counts). Host method: a walk of the layer; exec method: `du`."""
        if self._upper is not None:
            return _tree_bytes(self._upper)
        return max(0, self._du_bytes() - self._disk_baseline)

    def _trip(self, used: int) -> None:
        """Over budget: remember why (every exec raises it until prepare) and stop the writer."""
        if self._disk_exceeded is None:
            self._disk_exceeded = (f"[sandbox] disk budget exceeded: {used / _MiB:.0f} MiB > "
                                   f"{self.disk_limit_mb} MiB")
        try:
            self._run(["bash", "-c", KILL_USER_SCRIPT], what="disk watchdog kill", timeout=30)
        except SandboxError:
            pass

    def _disk_watch(self, stop: threading.Event) -> None:
        """While an exec runs: measure every DISK_POLL_S; over budget -> kill the user's processes."""
        while not stop.wait(DISK_POLL_S):
            try:
                used = self.disk_usage_bytes()
            except Exception:  # noqa: BLE001 - the check after the exec reports real failures
                continue
            if used > self.disk_limit_mb * _MiB:
                self._trip(used)
                return

    def _check_disk(self) -> None:
        """After an exec / write_file: SandboxResourceError if the disk budget is exceeded."""
        if not self.disk_limit_mb:
            return
        if self._disk_exceeded is None:
            used = self.disk_usage_bytes()
            if used > self.disk_limit_mb * _MiB:
                self._trip(used)
        self._raise_if_over_budget()

    def _raise_if_over_budget(self) -> None:
        if self._disk_exceeded is not None:
            raise SandboxResourceError(self._disk_exceeded)



def _tree_bytes(root: str) -> int:
    """Disk blocks (bytes) under host directory `root`, like `du -s` (hard links once)."""
    total, seen = 0, set()
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1 and not entry.is_dir(follow_symlinks=False):
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total

