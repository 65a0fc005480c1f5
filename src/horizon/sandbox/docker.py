"""Docker sandbox backend: one container per rollout, controlled by `exec` (docs/SPEC.md §5).

Isolation: no network (`network_mode="none"`), CPU/memory/pids limits, commands run as the
non-root user 1000:1000, all capabilities dropped, no-new-privileges, `init=True` (zombies
reaped). The container's own keep-alive process (`sleep infinity` under docker-init) runs as
root, so the sandbox user cannot kill it (`kill -9 -1` kills only the user's processes).
Commands run as `timeout -k 2 N bash -c CMD` inside the container (exec has no timeout of its
own and killing the client leaves the process running); the output stream is read in a thread
with a host-side deadline, and as a backstop the exec's process group is killed. Only the
command dies on a timeout; the sandbox keeps working.

Whose failure (docs/SPEC.md §4.1 "infrastructure is not the policy"): every engine failure -- an engine
error or timeout (`ENGINE_TIMEOUT_S` per API call), a closed, removed, stopped or killed container (also
one that dies while a command runs) -- raises `SandboxInfraError`. A command killed by the OOM killer
keeps its ExecResult (exit 137) with "[sandbox] killed: out of memory (limit N MiB)" appended. With
`disk_limit_mb > 0` a watchdog measures the container's writable layer after every exec / write_file and
every `DISK_POLL_S` while an exec runs; over budget it kills the user's processes and raises
`SandboxResourceError` (then on every exec / write_file until `prepare()`); every file a command writes
is also capped at the budget (`ulimit -f`).

Files are read and written as the sandbox user by an exec of `cat` (data through the exec's
stdin/stdout streams, binary-safe), so permissions and symlinks resolve inside the container
and errors read like cat's ("Permission denied", "No such file or directory", "Is a
directory"). `snapshot()` = `container.commit()`; `fork()` = a new container from a snapshot
with the same limits. Commit chains deeper than `flatten_after` layers are flattened (export
+ import) so the overlay ~125-layer limit is never hit (a flatten costs a full filesystem
copy, seconds for the base image). `prepare()` readies a pooled sandbox for its next episode.

Cleanup: every container/image carries `PROJECT_LABEL` plus owner pid, owner process start
time, host and session id labels. `close()` force-removes (idempotent); an atexit hook and
SIGTERM/SIGHUP handlers remove this process's containers; `cleanup_leaked()` removes what
crashed processes left behind (containers and snapshot images).

    with DockerSandbox.create("horizon-sandbox:base") as sb:
        sb.write_file("/workspace/a.py", "print(1)")
        r = sb.exec("python3 a.py", timeout=10)   # ExecResult(exit_code=0, output="1\\n", ...)
        child = sb.fork()                         # same files, diverges afterwards
"""

from __future__ import annotations

import atexit
import io
import os
import posixpath
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.utils.socket import frames_iter

from horizon.sandbox.base import (
    DEFAULT_BASE_IMAGE,
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_TIMEOUT_S,
    KILL_GRACE_S,
    PROJECT_LABEL,
    TIMEOUT_EXIT_CODES,
    WORKSPACE,
    ExecResult,
    OutputBuffer,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxInfraError,
    SandboxIsADirectoryError,
    SandboxPermissionError,
    SandboxResourceError,
    check_command,
    check_path,
)

# Label keys (all prefixed by PROJECT_LABEL so one filter finds everything we made).
LABEL_OWNER_PID = PROJECT_LABEL + ".owner_pid"
LABEL_OWNER_START = PROJECT_LABEL + ".owner_start"   # /proc start time: detects pid reuse
LABEL_OWNER_HOST = PROJECT_LABEL + ".owner_host"
LABEL_SESSION = PROJECT_LABEL + ".session"
LABEL_KIND = PROJECT_LABEL + ".kind"                 # "container" | "snapshot"

SNAPSHOT_REPO = "horizon-snapshot"
DEFAULT_FLATTEN_AFTER = 100   # layers; overlayfs/docker refuse images beyond ~125
HOST_DEADLINE_SLACK_S = 5.0   # host waits timeout + KILL_GRACE_S + this before the backstop
# Engine API call timeouts: a hung engine call raises SandboxInfraError after this, never hangs.
# They bound each request (connect + reading the answer), not an exec's output stream, which
# has no client read timeout (the command's own timeout and the host deadline govern it).
ENGINE_TIMEOUT_S = 60         # every call but the slow ones below
SLOW_ENGINE_TIMEOUT_S = 600   # commit / export / import (a whole container filesystem)
CLIENT_TIMEOUT_S = ENGINE_TIMEOUT_S   # (old name)
CLIENT_POOL_SIZE = 64         # connection pool >= concurrent sandbox threads
FILE_OP_TIMEOUT_S = 30.0      # in-sandbox limit of one read_file / write_file (+1 s per 16 MiB)
PREPARE_TIMEOUT_S = 30.0      # host deadline of prepare()'s exec
PREPARE_START_TRIES = 5       # prepare() retries an exec the sandbox could not start (fork bomb)
DISK_POLL_S = 0.5             # disk watchdog period while an exec runs
# How the disk watchdog measures: "auto" = walk the container's writable layer (GraphDriver
# UpperDir) from the host when this process can (root on the engine's host), else "exec"
# (`du` as the sandbox user over the places it can write, minus the usage at creation).
DISK_USAGE_METHOD = os.environ.get("HORIZON_DISK_USAGE_METHOD", "auto")   # "auto" | "host" | "exec"
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")   # emptied of the user's files by prepare()
MAIN_USER = "0:0"   # the container's keep-alive process: out of the sandbox user's reach
_MiB = 1 << 20

# Engine failures: docker-py raises DockerException subclasses for API errors, but lets
# requests' own errors (connection refused, read timeout) through.
_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)

SESSION_ID = uuid.uuid4().hex[:12]   # this process's session (re-made after os.fork)

# The exec wrapper: caps file size at the disk budget ($6 KiB, 0 = none), changes to the workdir
# (errors go to the output), then becomes GNU `timeout` (which puts itself in a new process
# group) renamed `horizon-<token>` so the backstop can find that group with pgrep without any
# state file.
_EXEC_SCRIPT = ('[ "$6" = 0 ] || ulimit -f "$6" || exit 1; cd -- "$2" || exit 1; '
                'exec -a "horizon-$4" timeout -k "$5" "$3" bash -c "$1"')
_KILL_SCRIPT = 'for p in $(pgrep -f "^horizon-$1 "); do kill -KILL -- "-$p" "$p"; done 2>/dev/null; true'
# File ops, run as the sandbox user: $1 path, $2 seconds, $3 file size cap (KiB, 0 = none), $4 mode.
_READ_SCRIPT = ('if [ -e "$1" ] && [ ! -f "$1" ] && [ ! -d "$1" ]; then echo "$1: not a regular file" >&2; '
                'exit 1; fi; exec timeout -k 2 "$2" cat -- "$1"')
# (A new file gets 644 from the umask: chmod only for another mode or an existing file.)
_WRITE_SCRIPT = ('[ "$3" = 0 ] || ulimit -f "$3" || exit 1; umask 022; p=$1; d=${p%/*}; d=${d:-/}; '
                 'if [ ! -d "$d" ]; then mkdir -p -- "$d" || exit 1; fi; '
                 'if [ -d "$p" ]; then echo "$p: Is a directory" >&2; exit 1; fi; '
                 '[ -e "$p" ] && old=1; timeout -k 2 "$2" tee -- "$p" > /dev/null || exit; '
                 'if { [ "$4" != 644 ] || [ -n "$old" ]; } && [ -O "$p" ]; then chmod "$4" -- "$p" || exit 1; fi')
# Every process of the calling user but this shell, SIGKILLed until none is left (the
# keep-alive process runs as MAIN_USER, out of reach). `[ -O /proc/PID ]`: owned by us.
_KILL_ALL_FN = r"""
me=$$
count() { left=0; for p in /proc/[0-9]*; do [ "${p#/proc/}" != "$me" ] && [ -O "$p" ] && left=$((left+1)); done; }
killall_user() {
  for i in {1..60}; do
    kill -9 -1 2>/dev/null; count; [ "$left" = 0 ] && return 0; sleep 0.05 2>/dev/null
  done
  return 1
}
"""
# prepare(): $1 = the container's creation time (epoch s); files in $HOME changed since then go.
_PREPARE_SCRIPT = _KILL_ALL_FN + rf"""
killall_user || {{ echo "prepare: $left processes of uid $(id -u) survive kill -9"; exit 3; }}
/bin/true || {{ echo "prepare: cannot fork/exec a trivial command"; exit 4; }}
uid=$(id -u)
for d in {" ".join(SCRATCH_DIRS)}; do
  [ -d "$d" ] || continue
  find "$d" -mindepth 1 -maxdepth 1 -user "$uid" -exec chmod -R u+rwX {{}} + 2>/dev/null
  find "$d" -mindepth 1 -maxdepth 1 -user "$uid" -exec rm -rf {{}} + 2>/dev/null
done
# the workspace is the caller's to restore; only make what the user locked up removable again
find {WORKSPACE} -type d -user "$uid" ! -perm -u=rwx -exec chmod u+rwx {{}} \; 2>/dev/null
case "$HOME" in
  ""|/|{WORKSPACE}|{WORKSPACE}/*) ;;
  *) if [ -d "$HOME" ]; then
       find "$HOME" -mindepth 1 -type d -user "$uid" ! -perm -u=rwx -exec chmod u+rwx {{}} \; 2>/dev/null
       find "$HOME" -mindepth 1 ! -type d -user "$uid" -newerct "@$1" -delete 2>/dev/null
     fi ;;
esac
count; [ "$left" = 0 ] || {{ echo "prepare: $left processes of uid $uid appeared during cleanup"; exit 3; }}
echo prepared
"""
_KILL_USER_SCRIPT = _KILL_ALL_FN + "killall_user"
# Usage (KiB) of the places the sandbox user can write, for the exec-based disk measurement.
_DU_SCRIPT = (f'du -skxc -- /workspace {" ".join(d for d in SCRATCH_DIRS if d != "/dev/shm")} "$HOME" '
              "2>/dev/null | tail -n 1")
_OOM_SCRIPT = "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; true"
_OOM_RE = re.compile(rb"^oom_kill (\d+)$", re.M)


def _proc_start_time(pid: int) -> str:
    """Start time (clock ticks since boot) of `pid`, '' if unknown: pid + start = identity."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _owner_alive(labels: dict[str, str]) -> bool:
    """Whether the process that created an object (per its labels) still runs on this host."""
    if labels.get(LABEL_OWNER_HOST) != socket.gethostname():
        return True  # another host's process: we cannot tell, so never treat it as dead
    try:
        pid = int(labels.get(LABEL_OWNER_PID, ""))
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = labels.get(LABEL_OWNER_START, "")
    return not start or _proc_start_time(pid) == start


_client_lock = threading.Lock()
_shared_clients: dict[bool, docker.DockerClient] = {}   # slow? -> client


def get_client(slow: bool = False) -> docker.DockerClient:
    """A process-wide Docker client with a pool big enough for many concurrent sandboxes.

    Its API calls time out after `ENGINE_TIMEOUT_S` (`slow=True`: `SLOW_ENGINE_TIMEOUT_S`, for
    commit / export / import)."""
    with _client_lock:
        client = _shared_clients.get(slow)
        if client is None:
            timeout = SLOW_ENGINE_TIMEOUT_S if slow else ENGINE_TIMEOUT_S
            try:
                client = docker.from_env(timeout=timeout, max_pool_size=CLIENT_POOL_SIZE)
            except _ENGINE_ERRORS as e:
                raise SandboxInfraError(f"cannot connect to the Docker engine: {e}") from e
            _shared_clients[slow] = client
        return client


def _slow_client_for(client: docker.DockerClient) -> docker.DockerClient:
    """The long-timeout twin of the shared client; a caller's own client serves both roles."""
    return get_client(slow=True) if client is _shared_clients.get(False) else client


# ---------------------------------------------------------------------------------------
# Process-exit cleanup of this process's own containers and snapshot images.
_live: dict[str, DockerSandbox] = {}   # strong refs: unclosed, dropped sandboxes still go at exit
_session_images: dict[str, docker.DockerClient] = {}   # image id -> client, this process only
_registry_pid = os.getpid()
_hooks_installed = False
_hooks_lock = threading.Lock()


def _reset_after_fork() -> None:
    """In a forked child, the parent's sandboxes are not ours to clean up."""
    global SESSION_ID, _registry_pid, _hooks_installed
    SESSION_ID = uuid.uuid4().hex[:12]
    _registry_pid = os.getpid()
    _live.clear()
    _session_images.clear()
    _shared_clients.clear()
    _hooks_installed = False


os.register_at_fork(after_in_child=_reset_after_fork)


def cleanup_session() -> None:
    """Remove every container and snapshot image this process created (atexit hook)."""
    if os.getpid() != _registry_pid:
        return
    for sb in list(_live.values()):
        try:
            sb.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    for client in set(_session_images.values()):
        _remove_images_repeatedly(client, [i for i, c in _session_images.items() if c is client])
    _session_images.clear()


def _on_signal(signum, frame):  # noqa: ARG001
    cleanup_session()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_signals_installed = False


def _install_hooks() -> None:
    """atexit cleanup once; SIGTERM/SIGHUP handlers as soon as we are called from the main thread.

    Sandboxes are often created from worker threads, where `signal.signal` is not allowed, so the
    signal part is retried on every call until a main-thread call (or `install_cleanup_hooks`)
    succeeds. Handlers are only installed where none is set already.
    """
    global _hooks_installed, _signals_installed
    with _hooks_lock:
        if not _hooks_installed:
            _hooks_installed = True
            atexit.register(cleanup_session)
        if not _signals_installed and threading.current_thread() is threading.main_thread():
            _signals_installed = True
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    signal.signal(sig, _on_signal)


def install_cleanup_hooks() -> None:
    """Call from the main thread of a driver that creates sandboxes only in worker threads."""
    _install_hooks()


def _remove_images_repeatedly(client: docker.DockerClient, image_ids: Iterable[str]) -> int:
    """Remove images, retrying in passes since a parent goes only after its children."""
    pending, removed = list(image_ids), 0
    while pending:
        left = []
        for img in pending:
            try:
                client.images.remove(img, force=True, noprune=False)
                removed += 1
            except docker.errors.ImageNotFound:
                removed += 0
            except _ENGINE_ERRORS:
                left.append(img)
        if len(left) == len(pending):
            break
        pending = left
    return removed


def cleanup_leaked(client: docker.DockerClient | None = None, *, only_dead_owners: bool = False,
                   labels: dict[str, str] | None = None) -> int:
    """Force-remove sandbox containers (then snapshot images) labelled with `PROJECT_LABEL`.

    Targets objects whose `horizon.sandbox.kind` label says DockerSandbox made them
    (containers; snapshot images and any container started from one), not task or base images.

    `only_dead_owners=True` spares objects whose owner process (pid + start time, same
    host) still runs, so it is safe to call at the start of a job while others run.
    `labels` narrows the sweep to objects that also carry these label values.
    Returns the number of containers + images removed.
    """
    client = client or get_client()
    extra = [f"{k}={v}" for k, v in (labels or {}).items()]
    removed = 0
    # Only containers DockerSandbox made (kind label), never e.g. `docker build` steps of a
    # task image that happens to carry PROJECT_LABEL.
    found = {c.id: c for kind in ("container", "snapshot")
             for c in client.containers.list(all=True,
                                             filters={"label": [PROJECT_LABEL, f"{LABEL_KIND}={kind}", *extra]})}
    for c in found.values():
        if only_dead_owners and _owner_alive(c.labels):
            continue
        try:
            c.remove(force=True)
            removed += 1
        except docker.errors.NotFound:
            pass
        except _ENGINE_ERRORS as e:
            if "already in progress" not in str(e):
                raise SandboxInfraError(f"cannot remove leaked container {c.short_id}: {e}") from e
    images = [im for im in client.images.list(filters={"label": [f"{LABEL_KIND}=snapshot", *extra]})
              if not (only_dead_owners and _owner_alive(im.labels or {}))]
    removed += _remove_images_repeatedly(client, [im.id for im in images])
    return removed


# ---------------------------------------------------------------------------------------
def _parse_user(user: str) -> tuple[int, int]:
    """Numeric uid/gid ("1000:1000" -> (1000, 1000)); the sandbox user must be numeric."""
    m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    if not m:
        raise ValueError(f"user must be numeric 'uid[:gid]' (e.g. '1000:1000'), got {user!r}")
    uid = int(m.group(1))
    return uid, int(m.group(2) or uid)


def _created_epoch(attrs: dict) -> int:
    """The container's creation time (engine clock) in whole seconds, rounded down."""
    m = re.match(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)", attrs.get("Created") or "")
    if not m:
        return int(time.time()) - 1
    import calendar  # noqa: PLC0415

    return calendar.timegm(tuple(int(g) for g in m.groups()) + (0, 0, 0)) - 1


class DockerSandbox:
    """A `Sandbox` backed by one Docker container (docs/SPEC.md §5). Create with `create()`."""

    def __init__(self, container, client: docker.DockerClient, spec: dict[str, Any]):
        self._container = container
        self._client = client
        self._slow_client = _slow_client_for(client)
        self._spec = spec   # everything `create` needs to make a sibling (fork)
        self._closed = False
        self._lock = threading.Lock()
        self._owned_images: list[str] = []   # removed on close (forks' private snapshots)
        self._snap_count = 0
        self.default_timeout = float(spec["default_timeout"])
        self.max_output_bytes = int(spec["max_output_bytes"])
        self.user = spec["user"]
        self.uid, self.gid = _parse_user(spec["user"])
        attrs = getattr(container, "attrs", None) or {}
        self._created = _created_epoch(attrs)
        self._mem_limit = int((attrs.get("HostConfig") or {}).get("Memory") or 0)
        self._oom_kills = 0                  # the cgroup's oom_kill counter when last read
        self.disk_limit_mb = int(spec.get("disk_limit_mb") or 0)
        self._disk_exceeded: str | None = None   # the watchdog's message once over budget
        self._upper: str | None = None       # host path of the writable layer (method "host")
        self._disk_baseline = 0              # bytes in the user's places at creation (method "exec")
        if self.disk_limit_mb:
            self._upper = self._host_upper_dir(attrs)
            if self._upper is None:
                self._disk_baseline = self._du_bytes()

    # -- lifecycle ------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        image: str | None = None,
        *,
        client: docker.DockerClient | None = None,
        cpus: float = 1.0,
        mem_limit: str = "1g",
        pids_limit: int = 256,
        network: bool = False,
        user: str = "1000:1000",
        labels: dict[str, str] | None = None,
        default_timeout: float = DEFAULT_TIMEOUT_S,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        flatten_after: int = DEFAULT_FLATTEN_AFTER,
        keep_snapshots: bool = False,
        disk_limit_mb: int = 0,
    ) -> DockerSandbox:
        """Start a container from `image` (default `HORIZON_BASE_IMAGE`) and return its sandbox.

        `network=False` means `network_mode="none"` (loopback only). `user` (numeric) runs
        every exec and file operation. `keep_snapshots=True` keeps images made by `snapshot()`
        after `close()` and process exit (e.g. to inspect end states; `cleanup_leaked` removes
        them once this process is gone); otherwise they go at close (or, if still in use by
        forks, at process exit). `disk_limit_mb > 0` turns on the disk budget watchdog (module
        docstring); forks inherit every limit. Engine failures raise `SandboxInfraError`.
        """
        if cpus <= 0 or pids_limit <= 0 or default_timeout <= 0 or max_output_bytes < 2 or disk_limit_mb < 0:
            raise ValueError(f"bad sandbox limits: cpus={cpus} pids_limit={pids_limit} "
                             f"default_timeout={default_timeout} max_output_bytes={max_output_bytes} "
                             f"disk_limit_mb={disk_limit_mb}")
        _parse_user(user)
        client = client or get_client()
        image = image or DEFAULT_BASE_IMAGE
        spec = dict(image=image, cpus=cpus, mem_limit=mem_limit, pids_limit=pids_limit, network=network,
                    user=user, labels=dict(labels or {}), default_timeout=default_timeout,
                    max_output_bytes=max_output_bytes, flatten_after=flatten_after,
                    keep_snapshots=keep_snapshots, disk_limit_mb=int(disk_limit_mb))
        _install_hooks()
        all_labels = {**spec["labels"], **cls._owner_labels("container")}
        try:
            container = client.containers.run(
                image, ["sleep", "infinity"], detach=True, init=True,
                network_mode="bridge" if network else "none",
                mem_limit=mem_limit, memswap_limit=mem_limit, nano_cpus=int(cpus * 1e9),
                pids_limit=pids_limit, cap_drop=["ALL"], security_opt=["no-new-privileges"],
                user=MAIN_USER, labels=all_labels, stop_signal="SIGKILL", working_dir=WORKSPACE,
                hostname="sandbox",
            )
        except docker.errors.ImageNotFound as e:
            raise SandboxInfraError(f"sandbox image {image!r} not found; build it with envs/build_base_image.sh "
                                    f"(base) or the task image builder: {e}") from e
        except _ENGINE_ERRORS as e:
            raise _engine_failure(f"cannot start sandbox from {image!r}", e) from e
        try:
            sb = cls(container, client, spec)
        except BaseException:   # (e.g. the disk baseline exec failed): do not leak the container
            try:
                container.remove(force=True)
            except _ENGINE_ERRORS:
                pass
            raise
        _live[container.id] = sb
        return sb

    @staticmethod
    def _owner_labels(kind: str) -> dict[str, str]:
        pid = os.getpid()
        return {PROJECT_LABEL: "1", LABEL_OWNER_PID: str(pid), LABEL_OWNER_START: _proc_start_time(pid),
                LABEL_OWNER_HOST: socket.gethostname(), LABEL_SESSION: SESSION_ID, LABEL_KIND: kind}

    @property
    def id(self) -> str:
        return self._container.id

    @property
    def container(self):
        """The docker-py Container (for inspection; do not remove it behind our back)."""
        return self._container

    @property
    def image(self) -> str:
        return self._spec["image"]

    def close(self) -> None:
        """Force-remove the container and the images this sandbox owns. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _live.pop(self._container.id, None)
        try:
            self._container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except _ENGINE_ERRORS as e:
            if "already in progress" not in str(e):
                raise SandboxInfraError(f"cannot remove sandbox {self._container.short_id}: {e}") from e
        if self._owned_images:
            gone = [i for i in self._owned_images
                    if _remove_images_repeatedly(self._client, [i]) or not self._image_exists(i)]
            for i in gone:
                _session_images.pop(i, None)
            self._owned_images.clear()

    def _image_exists(self, ref: str) -> bool:
        try:
            self._client.images.get(ref)
            return True
        except docker.errors.ImageNotFound:
            return False
        except _ENGINE_ERRORS:
            return True   # unknown: keep it registered for the exit hook

    def alive(self) -> bool:
        """Cheap health check (one inspect, no exec): open, and the container is running."""
        if self._closed:
            return False
        try:
            state = self._client.api.inspect_container(self._container.id).get("State") or {}
        except _ENGINE_ERRORS:
            return False
        return bool(state.get("Running")) and not state.get("Paused") and not state.get("Restarting")

    def prepare(self) -> None:
        """Make this (pooled) sandbox ready for its next episode; see `Sandbox.prepare`.

        One exec as the sandbox user: `kill -9 -1` until no process of the user is left (the
        keep-alive process is root's, out of reach), `/bin/true` (can fork/exec), then the
        user's entries in `SCRATCH_DIRS` removed and the non-directory files in its home
        changed since the container was created deleted. Clears a tripped disk budget.
        Raises `SandboxInfraError` when the sandbox cannot be made usable (replace it).
        """
        self._check_open()
        out, code = "", None
        for attempt in range(PREPARE_START_TRIES):
            if attempt:
                time.sleep(0.2 * attempt)
            code, stdout, stderr = self._run(["bash", "-c", _PREPARE_SCRIPT, "horizon-prepare", str(self._created)],
                                             what="prepare", timeout=PREPARE_TIMEOUT_S)
            out = (stdout + stderr).decode("utf-8", "replace").strip()
            if code == 0 and out.endswith("prepared"):
                self._disk_exceeded = None
                return
            if code in (3, 4):   # the script ran: processes survive or nothing can start
                break
            # the exec itself could not start (e.g. a fork bomb holds every pid): try again
        raise SandboxInfraError(f"prepare: sandbox {self._container.short_id} is unusable (exit {code}): "
                                f"{out[-500:]}")

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"DockerSandbox({self._container.short_id}, image={self.image!r}, {state})"

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxInfraError(f"sandbox {self._container.short_id} is closed")

    def _engine_error(self, what: str, e: Exception) -> SandboxInfraError:
        """An engine failure as a clear SandboxInfraError (dead or removed container, timeout)."""
        return _engine_failure(what, e, self._container.short_id)

    def _state(self, what: str) -> dict:
        """The container's State; SandboxInfraError if it is gone or the engine fails."""
        try:
            return self._client.api.inspect_container(self._container.id).get("State") or {}
        except _ENGINE_ERRORS as e:
            raise self._engine_error(what, e) from e

    def _raise_if_dead(self, what: str) -> bytes:
        """SandboxInfraError if the container stopped (killed, died, its init OOM-killed).

        The engine records a container's death a moment after its processes die, so a
        "running" state is confirmed by a probe exec (the OOM-counter read, whose output is
        returned); a probe that cannot run means the container is dying: infra as well.
        """
        state = self._state(what)
        out = b""
        if state.get("Running") and not state.get("Paused") and not state.get("Restarting"):
            try:
                eid = self._client.api.exec_create(self._container.id, ["bash", "-c", _OOM_SCRIPT],
                                                   user=self.user, workdir="/")["Id"]
                out = self._client.api.exec_start(eid)
                if self._exit_code(eid) == 0:
                    return out
            except _ENGINE_ERRORS:
                pass
            for _ in range(40):   # the probe failed: wait for the engine to see the death
                state = self._state(what)
                if not state.get("Running"):
                    break
                time.sleep(0.05)
        raise SandboxInfraError(
            f"{what}: sandbox container {self._container.short_id} died while the command ran "
            f"(status {state.get('Status')!r}, exit code {state.get('ExitCode')}, "
            f"OOMKilled={state.get('OOMKilled')}{', ' + state['Error'] if state.get('Error') else ''}"
            f"{'' if not state.get('Running') else '; a probe exec failed'})")

    # -- exec -----------------------------------------------------------------------------
    def _start_exec(self, argv: list[str], what: str, *, user: str | None = None, stdin: bool = False,
                    workdir: str | None = None):
        """(exec id, hijacked socket) of a started exec; SandboxInfraError on engine failure."""
        api = self._client.api
        try:
            exec_id = api.exec_create(self._container.id, argv, stdout=True, stderr=True, stdin=stdin,
                                      user=user or self.user, workdir=workdir)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except _ENGINE_ERRORS as e:
            raise self._engine_error(what, e) from e
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(None)   # no client-side read timeout on the stream: our deadlines govern
        return exec_id, sock

    def exec(self, cmd: str, timeout: float | None = None, workdir: str = WORKSPACE) -> ExecResult:
        """Run `cmd` with `bash -c` in `workdir`; kill it (not the sandbox) after `timeout` s.

        `SandboxInfraError` if the engine fails or the container dies meanwhile;
        `SandboxResourceError` if the disk budget is (or was already) exceeded.
        """
        self._check_open()
        check_command(cmd)
        check_path(workdir, "workdir")
        timeout = self.default_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self._raise_if_over_budget()
        token = uuid.uuid4().hex
        argv = ["bash", "-c", _EXEC_SCRIPT, "horizon-exec", cmd, workdir, f"{timeout:.3f}", token,
                str(KILL_GRACE_S), str(self._fsize_kib())]
        t0 = time.monotonic()
        exec_id, sock = self._start_exec(argv, "exec failed")
        raw = getattr(sock, "_sock", sock)
        buf = OutputBuffer(self.max_output_bytes)
        reader = threading.Thread(target=_drain, args=(sock, buf), daemon=True)
        reader.start()
        watch_stop = threading.Event()
        watchdog = None
        if self.disk_limit_mb:
            watchdog = threading.Thread(target=self._disk_watch, args=(watch_stop,), daemon=True)
            watchdog.start()
        reader.join(timeout + KILL_GRACE_S + HOST_DEADLINE_SLACK_S)
        host_killed = reader.is_alive()
        if host_killed:   # `timeout` itself is stuck or the stream hangs: backstop kill
            self._backstop_kill(exec_id, token)
            reader.join(KILL_GRACE_S)
        _close_quietly(raw, sock)
        reader.join(1.0)
        watch_stop.set()
        exit_code = self._exit_code(exec_id)
        duration = time.monotonic() - t0
        probe = None
        if host_killed or exit_code is None or exit_code in (137, -1):
            if watchdog is not None:
                watchdog.join()
            if self._disk_exceeded is not None and self._state("exec").get("Running"):
                # the watchdog killed the command (and may still be killing the user's processes, so a
                # probe exec as the user could die too): the policy's resource failure, not infra
                raise SandboxResourceError(self._disk_exceeded)
            probe = self._raise_if_dead("exec")   # killed with its container: not the command's failure
            if exit_code is None:
                if not host_killed:
                    raise SandboxInfraError(f"exec: the engine reported no exit status for the command "
                                            f"in sandbox {self._container.short_id}")
                exit_code = 137
        if watchdog is not None:
            watchdog.join()
        timed_out = host_killed or (exit_code in TIMEOUT_EXIT_CODES and duration >= timeout * 0.98)
        if exit_code == 137 and not timed_out and self._oom_killed(probe):
            limit = f"{self._mem_limit / _MiB:g} MiB" if self._mem_limit else "the memory limit"
            sep = "" if buf.total == 0 or bytes(buf.tail or buf.head).endswith(b"\n") else "\n"
            buf.feed(f"{sep}[sandbox] killed: out of memory (limit {limit})\n".encode())
        self._check_disk()
        output, truncated = buf.result()
        return ExecResult(exit_code=exit_code, output=output, timed_out=timed_out,
                          truncated=truncated, duration_s=duration)

    def _exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code once the engine has it; None if it has none (or fails)."""
        delay = 0.002
        deadline = time.monotonic() + 2.0
        while True:   # the stream can end a moment before the engine records the exit
            try:
                info = self._client.api.exec_inspect(exec_id)
            except _ENGINE_ERRORS:
                return None
            if not info.get("Running"):
                return info.get("ExitCode")
            if time.monotonic() > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _run(self, argv: list[str], *, what: str, timeout: float, stdin: bytes | None = None,
             user: str | None = None) -> tuple[int | None, bytes, bytes]:
        """Run a helper to completion: (exit code, stdout, stderr), stdin fed from `stdin`.

        The helper bounds itself (e.g. `timeout` inside); past `timeout` s on the host the
        sandbox is not answering: SandboxInfraError. So is a container dead afterwards.
        """
        exec_id, sock = self._start_exec(argv, what, user=user, stdin=stdin is not None, workdir="/")
        raw = getattr(sock, "_sock", sock)
        out, err = bytearray(), bytearray()
        reader = threading.Thread(target=_drain_split, args=(sock, out, err), daemon=True)
        reader.start()
        if stdin is not None:
            writer = threading.Thread(target=_feed, args=(raw, stdin), daemon=True)
            writer.start()
        reader.join(timeout)
        hung = reader.is_alive()
        _close_quietly(raw, sock)
        reader.join(1.0)
        if hung:
            self._raise_if_dead(what)
            raise SandboxInfraError(f"{what}: sandbox {self._container.short_id} did not answer within "
                                    f"{timeout:g} s")
        code = self._exit_code(exec_id)
        if code is None or code in (137, -1):
            self._raise_if_dead(what)
        return code, bytes(out), bytes(err)

    def _exec_quiet(self, argv: list[str]) -> None:
        """Fire-and-wait a tiny helper command as the sandbox user, ignoring every error."""
        try:
            eid = self._client.api.exec_create(self._container.id, argv, user=self.user)["Id"]
            self._client.api.exec_start(eid)
        except _ENGINE_ERRORS:
            pass

    def _backstop_kill(self, exec_id: str, token: str) -> None:
        """Kill the exec's process group inside the container, and its host pid if visible."""
        self._exec_quiet(["bash", "-c", _KILL_SCRIPT, "horizon-kill", token])
        try:
            pid = int(self._client.api.exec_inspect(exec_id).get("Pid") or 0)
        except _ENGINE_ERRORS:
            return
        if pid > 0:
            try:   # only if that host pid really is in our container (same pid namespace)
                with open(f"/proc/{pid}/cgroup") as f:
                    if self._container.id in f.read():
                        os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    def _oom_killed(self, cgroup_text: bytes | None) -> bool:
        """Whether the cgroup's oom_kill counter (v2 memory.events / v1 memory.oom_control, as
        read by `_OOM_SCRIPT`) rose since last read: the kernel's OOM killer struck here."""
        counts = [int(n) for n in _OOM_RE.findall(cgroup_text or b"")]
        if not counts:
            return False
        n, seen = max(counts), self._oom_kills
        self._oom_kills = n
        return n > seen

    # -- disk budget watchdog -------------------------------------------------------------
    def _fsize_kib(self) -> int:
        """`ulimit -f` (KiB) for the sandbox user's processes: one MiB above the budget, 0 = none."""
        return (self.disk_limit_mb + 1) * 1024 if self.disk_limit_mb else 0

    @staticmethod
    def _host_upper_dir(attrs: dict) -> str | None:
        """The writable layer's host directory when this process can walk it, else None."""
        if DISK_USAGE_METHOD == "exec" or not hasattr(os, "geteuid") or os.geteuid() != 0:
            return None
        upper = ((attrs.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir")
        if upper and os.path.isdir(upper):
            return upper
        if DISK_USAGE_METHOD == "host":
            raise SandboxInfraError(f"disk usage method 'host': writable layer {upper!r} is not readable here")
        return None

    def _du_bytes(self) -> int:
        code, out, _ = self._run(["bash", "-c", _DU_SCRIPT], what="disk usage", timeout=60)
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
            self._run(["bash", "-c", _KILL_USER_SCRIPT], what="disk watchdog kill", timeout=30)
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

    # -- files ----------------------------------------------------------------------------
    def _file_timeout(self, nbytes: int) -> float:
        return FILE_OP_TIMEOUT_S + nbytes / (16 * _MiB)

    def read_file(self, path: str) -> bytes:
        """Bytes of the file at absolute `path`, read as the sandbox user (`cat`)."""
        self._check_open()
        check_path(path)
        t = self._file_timeout(0)
        code, out, err = self._run(["bash", "-c", _READ_SCRIPT, "horizon-read", path, f"{t:.0f}"],
                                   what=f"read_file({path})", timeout=t + KILL_GRACE_S + HOST_DEADLINE_SLACK_S)
        if code == 0:
            return out
        raise _file_error("read_file", path, code, err)

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create/overwrite `path` as the sandbox user (parents created with `mkdir -p` as the
        user; `mode` applied when the user owns the file). Data goes through the exec's stdin."""
        self._check_open()
        check_path(path)
        if path.endswith("/"):
            raise SandboxIsADirectoryError(f"write_file: {path}: Is a directory")
        payload = data.encode() if isinstance(data, str) else bytes(data)
        self._raise_if_over_budget()
        t = self._file_timeout(len(payload))
        code, _out, err = self._run(
            ["bash", "-c", _WRITE_SCRIPT, "horizon-write", path, f"{t:.0f}", str(self._fsize_kib()),
             f"{mode & 0o7777:o}"],
            what=f"write_file({path})", timeout=t + KILL_GRACE_S + HOST_DEADLINE_SLACK_S, stdin=payload)
        self._check_disk()
        if code != 0:
            raise _file_error("write_file", path, code, err)

    # -- snapshot / fork ------------------------------------------------------------------
    def snapshot(self, tag: str | None = None) -> str:
        """Commit the filesystem to a labelled image; returns its id (usable by `fork`/`create`)."""
        return self._snapshot(tag, owned=not self._spec["keep_snapshots"])

    def _snapshot(self, tag: str | None, owned: bool) -> str:
        self._check_open()
        self._snap_count += 1
        tag = re.sub(r"[^A-Za-z0-9_.-]", "-",
                     tag or f"{SESSION_ID}-{self._container.short_id}-{self._snap_count}")[:120]
        labels = {**self._spec["labels"], **self._owner_labels("snapshot")}
        try:
            res = self._slow_client.api.commit(self._container.id, repository=SNAPSHOT_REPO, tag=tag,
                                               conf={"Labels": labels})
            img = self._client.images.get(res["Id"])
            if len(img.attrs.get("RootFS", {}).get("Layers", [])) > self._spec["flatten_after"]:
                img = self._flatten(img, tag, labels)
        except _ENGINE_ERRORS as e:
            raise self._engine_error("snapshot failed", e) from e
        if owned:   # kept snapshots outlive the process (until cleanup_leaked)
            _session_images[img.id] = self._client
            self._owned_images.append(img.id)
        return img.id

    def _flatten(self, deep_image, tag: str, labels: dict[str, str]):
        """Re-import the container's filesystem as a single-layer image with the same config."""
        cfg = deep_image.attrs.get("Config", {}) or {}
        changes = [f"ENV {e}" for e in cfg.get("Env") or []]
        if cfg.get("WorkingDir"):
            changes.append(f"WORKDIR {cfg['WorkingDir']}")
        if cfg.get("User"):
            changes.append(f"USER {cfg['User']}")
        changes.append('CMD ["sleep","infinity"]')
        changes += [f'LABEL "{k}"="{v}"' for k, v in {**(cfg.get("Labels") or {}), **labels}.items()]
        stream = self._slow_client.api.export(self._container.id)
        self._slow_client.api.import_image_from_data(_IterReader(stream), repository=SNAPSHOT_REPO, tag=tag,
                                                     changes=changes)
        flat = self._client.images.get(f"{SNAPSHOT_REPO}:{tag}")
        if flat.id != deep_image.id:
            _remove_images_repeatedly(self._client, [deep_image.id])
        return flat

    def fork(self, *, workspace_only: bool = False) -> DockerSandbox:
        """A new, independent sandbox (same limits) from this one's current filesystem.

        Default: commit the whole container filesystem (full fidelity). With
        `workspace_only=True` only `WORKSPACE` is copied (tar) into a fresh container of the
        same image: changes elsewhere (e.g. /tmp, installed packages) are not carried, but
        it avoids a commit, which is slow on storage drivers with a naive diff
        (fuse-overlayfs: seconds; overlay2: sub-second).
        """
        spec = {k: v for k, v in self._spec.items() if k != "image"}
        if not workspace_only:
            ref = self._snapshot(None, owned=False)
            try:
                child = DockerSandbox.create(ref, client=self._client, **spec)
            except BaseException:
                _remove_images_repeatedly(self._client, [ref])
                raise
            child._owned_images.append(ref)   # the fork's private snapshot goes with the fork
            return child
        self._check_open()
        try:
            stream, _ = self._slow_client.api.get_archive(self._container.id, WORKSPACE)
            data = b"".join(stream)
        except _ENGINE_ERRORS as e:
            raise self._engine_error("fork failed", e) from e
        child = DockerSandbox.create(self.image, client=self._client, **spec)
        try:
            r = child.exec(f"find {WORKSPACE} -mindepth 1 -delete", timeout=60, workdir="/")
            if r.exit_code != 0:
                raise SandboxInfraError(f"fork: cannot clear the child's workspace: {r.output.strip()}")
            try:
                child._slow_client.api.put_archive(child._container.id, posixpath.dirname(WORKSPACE), data)
            except _ENGINE_ERRORS as e:
                raise child._engine_error("fork failed", e) from e
        except BaseException:
            child.close()
            raise
        return child

    @classmethod
    def from_snapshot(cls, ref: str, **kwargs) -> DockerSandbox:
        """A sandbox from a snapshot returned by `snapshot()` (same as `create(ref, ...)`)."""
        return cls.create(ref, **kwargs)


class _IterReader(io.RawIOBase):
    """File-like view of a byte-chunk iterator (for streaming export -> import)."""

    def __init__(self, chunks):
        self._it, self._buf = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def _engine_failure(what: str, e: Exception, cid: str | None = None) -> SandboxInfraError:
    """SandboxInfraError saying which engine failure `e` is (gone / stopped / timeout / ...)."""
    if cid is not None and isinstance(e, docker.errors.NotFound):
        return SandboxInfraError(f"{what}: sandbox container {cid} no longer exists ({e})")
    if (cid is not None and isinstance(e, docker.errors.APIError) and e.response is not None
            and e.response.status_code == 409):
        return SandboxInfraError(f"{what}: sandbox container {cid} is not running ({e})")
    if isinstance(e, requests.exceptions.Timeout):
        return SandboxInfraError(f"{what}: the Docker engine did not answer in time ({e})")
    if isinstance(e, requests.exceptions.ConnectionError):
        return SandboxInfraError(f"{what}: cannot reach the Docker engine ({e})")
    return SandboxInfraError(f"{what}: Docker engine error: {e}")


def _drain(sock, buf: OutputBuffer) -> None:
    """Reader thread: demultiplex the exec stream into `buf` until EOF or socket close."""
    try:
        for _stream, data in frames_iter(sock, tty=False):
            buf.feed(data)
    except (OSError, ValueError):
        pass


def _drain_split(sock, out: bytearray, err: bytearray) -> None:
    """Reader thread: stdout frames into `out`, stderr frames into `err`, until EOF."""
    try:
        for stream, data in frames_iter(sock, tty=False):
            (err if stream == 2 else out).extend(data)
    except (OSError, ValueError):
        pass


def _feed(raw, data: bytes) -> None:
    """Writer thread: `data` to the exec's stdin, then EOF (half-close). A process that exits
    without reading everything closes the stream: its exit status says why."""
    try:
        if data:
            raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _close_quietly(raw, sock) -> None:
    for fn in (lambda: raw.shutdown(socket.SHUT_RDWR), raw.close, sock.close):
        try:
            fn()
        except (OSError, AttributeError):
            pass
    resp = getattr(sock, "_response", None)
    if resp is not None:
        try:
            resp.close()
        except Exception:  # noqa: BLE001
            pass


# "bash: line 1: ", "cat: ", "tee: ", "timeout: " prefixes dropped so messages read like the file's own error.
_MSG_PREFIX = re.compile(r"^(?:(?:bash|horizon-\w+): (?:line \d+: )?)?(?:cat: |tee: |timeout: )?")


def _file_error(op: str, path: str, code: int | None, err: bytes) -> SandboxError:
    """The SandboxError subclass for a failed read_file / write_file helper (the policy's)."""
    lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    detail = _MSG_PREFIX.sub("", lines[-1].strip()) if lines else ""
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
