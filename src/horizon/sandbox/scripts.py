"""The shell scripts a Docker sandbox runs as its user, and how their errors read
(docs/SANDBOX.md). The same scripts run through the in-box executor and through a plain
`docker exec`, so both paths mean the same thing by a read, a write or a prepare."""

from __future__ import annotations

import re

from horizon.sandbox.base import (
    WORKSPACE,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxIsADirectoryError,
    SandboxPermissionError,
)

SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")   # emptied of the user's files by prepare()

# The exec wrapper: caps file size at the disk budget ($6 KiB, 0 = none), changes to the workdir
# (errors go to the output), then becomes GNU `timeout` (which puts itself in a new process
# group) renamed `horizon-<token>` so the backstop can find that group with pgrep without any
# state file.
EXEC_SCRIPT = ('[ "$6" = 0 ] || ulimit -f "$6" || exit 1; cd -- "$2" || exit 1; '
                'exec -a "horizon-$4" timeout -k "$5" "$3" bash -c "$1"')
KILL_SCRIPT = 'for p in $(pgrep -f "^horizon-$1 "); do kill -KILL -- "-$p" "$p"; done 2>/dev/null; true'
# File ops, run as the sandbox user: $1 path, $2 seconds, $3 file size cap (KiB, 0 = none), $4 mode.
READ_SCRIPT = ('if [ -e "$1" ] && [ ! -f "$1" ] && [ ! -d "$1" ]; then echo "$1: not a regular file" >&2; '
                'exit 1; fi; exec timeout -k 2 "$2" cat -- "$1"')
# (A new file gets 644 from the umask: chmod only for another mode or an existing file.)
WRITE_SCRIPT = ('[ "$3" = 0 ] || ulimit -f "$3" || exit 1; umask 022; p=$1; d=${p%/*}; d=${d:-/}; '
                 'if [ ! -d "$d" ]; then mkdir -p -- "$d" || exit 1; fi; '
                 'if [ -d "$p" ]; then echo "$p: Is a directory" >&2; exit 1; fi; '
                 '[ -e "$p" ] && old=1; timeout -k 2 "$2" tee -- "$p" > /dev/null || exit; '
                 'if { [ "$4" != 644 ] || [ -n "$old" ]; } && [ -O "$p" ]; then chmod "$4" -- "$p" || exit 1; fi')
# Every process of the calling user but this shell, SIGKILLed until none is left (the
# keep-alive process runs as MAIN_USER, out of reach). `[ -O /proc/PID ]`: owned by us.
KILL_ALL_FN = r"""
me=$$
count() { left=0; for p in /proc/[0-9]*; do [ "${p#/proc/}" != "$me" ] && [ -O "$p" ] && left=$((left+1)); done; }
killall_user() {
  i=0
  while [ "$i" -lt 60 ]; do
    i=$((i+1)); kill -9 -1 2>/dev/null; count; [ "$left" = 0 ] && return 0; sleep 0.05 2>/dev/null
  done
  return 1
}
"""
# prepare() (POSIX sh): $1 = the container's creation time (epoch s), files in $HOME changed since then go;
# $5 = the user's uid. Then, if $2 is a command: "prepared", and the reset $2 (POSIX sh) in directory $3.
PREPARE_SCRIPT = KILL_ALL_FN + rf"""
uid=$5
killall_user || {{ echo "prepare: $left processes of uid $uid survive kill -9"; exit 3; }}
/bin/true || {{ echo "prepare: cannot fork/exec a trivial command"; exit 4; }}
dirs=; for d in {" ".join(SCRATCH_DIRS)}; do [ -d "$d" ] && dirs="$dirs $d"; done
[ -z "$dirs" ] || find $dirs -mindepth 1 -maxdepth 1 -user "$uid" \
  -exec sh -c 'chmod -R u+rwX "$@"; rm -rf "$@"' sh {{}} + 2>/dev/null
# the workspace is the caller's to restore; only make what the user locked up (there and in its home)
# removable again
home=; case "$HOME" in ""|/|{WORKSPACE}|{WORKSPACE}/*) ;; *) [ -d "$HOME" ] && home=$HOME ;; esac
find {WORKSPACE} $home -type d -user "$uid" ! -perm -u=rwx -exec chmod u+rwx {{}} \; 2>/dev/null
[ -z "$home" ] || find "$home" -mindepth 1 ! -type d -user "$uid" -newerct "@$1" -delete 2>/dev/null
count; [ "$left" = 0 ] || {{ echo "prepare: $left processes of uid $uid appeared during cleanup"; exit 3; }}
echo prepared
[ -n "$2" ] || exit 0
cd -- "$3" || exit 1
eval "$2"
"""
KILL_USER_SCRIPT = KILL_ALL_FN + "killall_user"
# Usage (KiB) of the places the sandbox user can write, for the exec-based disk measurement.
DU_SCRIPT = (f'du -skxc -- /workspace {" ".join(d for d in SCRATCH_DIRS if d != "/dev/shm")} "$HOME" '
              "2>/dev/null | tail -n 1")
OOM_SCRIPT = "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; true"
OOM_RE = re.compile(rb"^oom_kill (\d+)$", re.M)


def oom_count(cgroup_text: bytes | None) -> int | None:
    """The cgroup's oom_kill counter in `OOM_SCRIPT`'s output (v2 memory.events / v1
    memory.oom_control), None where it shows none."""
    counts = [int(n) for n in OOM_RE.findall(cgroup_text or b"")]
    return max(counts) if counts else None


# "bash: line 1: " (dash: "sh: 1: "), "cat: ", "tee: ", "timeout: " prefixes dropped: messages read like
# the file's own error.
MSG_PREFIX = re.compile(r"^(?:(?:bash|sh|horizon-\w+): (?:(?:line )?\d+: )?)?(?:cat: |tee: |timeout: )?")


def file_error(op: str, path: str, code: int | None, err: bytes) -> SandboxError:
    """The SandboxError subclass for a failed read_file / write_file helper (the policy's)."""
    lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    detail = MSG_PREFIX.sub("", lines[-1].strip()) if lines else ""
    if code in (124, 137) and not detail:
        detail = f"{path}: timed out"
    elif code == 153 or "File size limit exceeded" in detail:
        detail = f"{path}: File too large (the sandbox's disk budget)"
    elif not detail:
        detail = f"{path}: failed (exit code {code})"
    msg = f"{op}: {detail}"
    if "No such file or directory" in detail:
        return SandboxFileNotFoundError(msg)
    if "Permission denied" in detail or "Operation not permitted" in detail:
        return SandboxPermissionError(msg)
    if "Is a directory" in detail:
        return SandboxIsADirectoryError(msg)
    return SandboxError(msg)

