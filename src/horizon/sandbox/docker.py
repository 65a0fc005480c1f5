"""Docker sandbox backend: one container per rollout, controlled by `exec` (SPEC §5).

Isolation: no network (`network_mode="none"`), CPU/memory/pids limits, non-root user
1000:1000, all capabilities dropped, no-new-privileges, `init=True` (zombies reaped).
Commands run as `timeout -k 2 N bash -c CMD` inside the container (exec has no timeout of
its own and killing the client leaves the process running); the output stream is read in
a thread with a host-side deadline, and as a backstop the exec's process group is killed.
Only the command dies on a timeout; the sandbox keeps working.

Files move with `put_archive`/`get_archive` (the workspace lives in the container layer,
not a tmpfs, so copies and commits see it). `snapshot()` = `container.commit()`; `fork()`
= a new container from a snapshot with the same limits. Commit chains deeper than
`flatten_after` layers are flattened (export + import) so the overlay ~125-layer limit is
never hit (a flatten costs a full filesystem copy, seconds for the base image).

Cleanup: every container/image carries `PROJECT_LABEL` plus owner pid, owner process start
time, host and session id labels. `close()` force-removes (idempotent); an atexit hook and
SIGTERM/SIGHUP handlers remove this process's containers; `cleanup_leaked()` removes what
crashed processes left behind.

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
import tarfile
import threading
import time
import uuid
from typing import Any, Iterable

import docker
import docker.errors
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
CLIENT_TIMEOUT_S = 120        # engine API call timeout (commit/export of big images)
CLIENT_POOL_SIZE = 64         # connection pool >= concurrent sandbox threads

SESSION_ID = uuid.uuid4().hex[:12]   # this process's session (re-made after os.fork)

# The exec wrapper: changes to the workdir (errors go to the output), then becomes GNU
# `timeout` (which puts itself in a new process group) renamed `horizon-<token>` so the
# backstop can find that group with pgrep without any state file.
_EXEC_SCRIPT = 'cd -- "$2" || exit 1; exec -a "horizon-$4" timeout -k "$5" "$3" bash -c "$1"'
_KILL_SCRIPT = 'for p in $(pgrep -f "^horizon-$1 "); do kill -KILL -- "-$p" "$p"; done 2>/dev/null; true'


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
_shared_client: docker.DockerClient | None = None


def get_client() -> docker.DockerClient:
    """A process-wide Docker client with a pool big enough for many concurrent sandboxes."""
    global _shared_client
    with _client_lock:
        if _shared_client is None:
            try:
                _shared_client = docker.from_env(timeout=CLIENT_TIMEOUT_S, max_pool_size=CLIENT_POOL_SIZE)
            except docker.errors.DockerException as e:
                raise SandboxError(f"cannot connect to the Docker engine: {e}") from e
        return _shared_client


# ---------------------------------------------------------------------------------------
# Process-exit cleanup of this process's own containers and snapshot images.
_live: dict[str, "DockerSandbox"] = {}   # strong refs: unclosed, dropped sandboxes still go at exit
_session_images: dict[str, docker.DockerClient] = {}   # image id -> client, this process only
_registry_pid = os.getpid()
_hooks_installed = False
_hooks_lock = threading.Lock()


def _reset_after_fork() -> None:
    """In a forked child, the parent's sandboxes are not ours to clean up."""
    global SESSION_ID, _registry_pid, _shared_client, _hooks_installed
    SESSION_ID = uuid.uuid4().hex[:12]
    _registry_pid = os.getpid()
    _live.clear()
    _session_images.clear()
    _shared_client = None
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
            except docker.errors.APIError:
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
             for c in client.containers.list(all=True, filters={"label": [PROJECT_LABEL, f"{LABEL_KIND}={kind}", *extra]})}
    for c in found.values():
        if only_dead_owners and _owner_alive(c.labels):
            continue
        try:
            c.remove(force=True)
            removed += 1
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise SandboxError(f"cannot remove leaked container {c.short_id}: {e}") from e
    images = [im for im in client.images.list(filters={"label": [f"{LABEL_KIND}=snapshot", *extra]})
              if not (only_dead_owners and _owner_alive(im.labels or {}))]
    removed += _remove_images_repeatedly(client, [im.id for im in images])
    return removed


# ---------------------------------------------------------------------------------------
def _parse_user(user: str) -> tuple[int, int]:
    """Numeric uid/gid for TarInfo ownership ("1000:1000" -> (1000, 1000))."""
    m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    if not m:
        raise ValueError(f"user must be numeric 'uid[:gid]' (e.g. '1000:1000'), got {user!r}")
    uid = int(m.group(1))
    return uid, int(m.group(2) or uid)


class DockerSandbox:
    """A `Sandbox` backed by one Docker container (SPEC §5). Create with `create()`."""

    def __init__(self, container, client: docker.DockerClient, spec: dict[str, Any]):
        self._container = container
        self._client = client
        self._spec = spec   # everything `create` needs to make a sibling (fork)
        self._closed = False
        self._lock = threading.Lock()
        self._owned_images: list[str] = []   # removed on close (forks' private snapshots)
        self._snap_count = 0
        self.default_timeout = float(spec["default_timeout"])
        self.max_output_bytes = int(spec["max_output_bytes"])
        self.uid, self.gid = _parse_user(spec["user"])

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
    ) -> "DockerSandbox":
        """Start a container from `image` (default `HORIZON_BASE_IMAGE`) and return its sandbox.

        `network=False` means `network_mode="none"` (loopback only). `keep_snapshots=True`
        keeps images made by `snapshot()` after `close()` and process exit (e.g. to inspect
        end states; `cleanup_leaked` removes them once this process is gone); otherwise they
        go at close (or, if still in use by forks, at process exit).
        """
        if cpus <= 0 or pids_limit <= 0 or default_timeout <= 0 or max_output_bytes < 2:
            raise ValueError(f"bad sandbox limits: cpus={cpus} pids_limit={pids_limit} "
                             f"default_timeout={default_timeout} max_output_bytes={max_output_bytes}")
        _parse_user(user)
        client = client or get_client()
        image = image or DEFAULT_BASE_IMAGE
        spec = dict(image=image, cpus=cpus, mem_limit=mem_limit, pids_limit=pids_limit, network=network,
                    user=user, labels=dict(labels or {}), default_timeout=default_timeout,
                    max_output_bytes=max_output_bytes, flatten_after=flatten_after,
                    keep_snapshots=keep_snapshots)
        _install_hooks()
        all_labels = {**spec["labels"], **cls._owner_labels("container")}
        try:
            container = client.containers.run(
                image, ["sleep", "infinity"], detach=True, init=True,
                network_mode="bridge" if network else "none",
                mem_limit=mem_limit, memswap_limit=mem_limit, nano_cpus=int(cpus * 1e9),
                pids_limit=pids_limit, cap_drop=["ALL"], security_opt=["no-new-privileges"],
                user=user, labels=all_labels, stop_signal="SIGKILL", working_dir=WORKSPACE,
                hostname="sandbox",
            )
        except docker.errors.ImageNotFound as e:
            raise SandboxError(f"sandbox image {image!r} not found; build it with envs/build_base_image.sh "
                               f"(base) or the task image builder: {e}") from e
        except docker.errors.DockerException as e:
            raise SandboxError(f"cannot start sandbox from {image!r}: {e}") from e
        sb = cls(container, client, spec)
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
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise SandboxError(f"cannot remove sandbox {self._container.short_id}: {e}") from e
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

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"DockerSandbox({self._container.short_id}, image={self.image!r}, {state})"

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self._container.short_id} is closed")

    def _engine_error(self, what: str, e: Exception) -> SandboxError:
        """Turn an engine error into a clear SandboxError (dead or removed container)."""
        if isinstance(e, docker.errors.NotFound):
            return SandboxError(f"{what}: sandbox container {self._container.short_id} no longer exists ({e})")
        if isinstance(e, docker.errors.APIError) and e.response is not None and e.response.status_code == 409:
            return SandboxError(f"{what}: sandbox container {self._container.short_id} is not running ({e})")
        return SandboxError(f"{what}: {e}")

    # -- exec -----------------------------------------------------------------------------
    def exec(self, cmd: str, timeout: float | None = None, workdir: str = WORKSPACE) -> ExecResult:
        """Run `cmd` with `bash -c` in `workdir`; kill it (not the sandbox) after `timeout` s."""
        self._check_open()
        timeout = self.default_timeout if timeout is None else float(timeout)
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        token = uuid.uuid4().hex
        argv = ["bash", "-c", _EXEC_SCRIPT, "horizon-exec", cmd, workdir, f"{timeout:.3f}", token,
                str(KILL_GRACE_S)]
        api = self._client.api
        t0 = time.monotonic()
        try:
            exec_id = api.exec_create(self._container.id, argv, stdout=True, stderr=True)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except docker.errors.DockerException as e:
            raise self._engine_error("exec failed", e) from e
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(None)   # no client-side read timeout: our deadline governs
        buf = OutputBuffer(self.max_output_bytes)
        reader = threading.Thread(target=_drain, args=(sock, buf), daemon=True)
        reader.start()
        reader.join(timeout + KILL_GRACE_S + HOST_DEADLINE_SLACK_S)
        host_killed = reader.is_alive()
        if host_killed:   # `timeout` itself is stuck or the stream hangs: backstop kill
            self._backstop_kill(exec_id, token)
            reader.join(KILL_GRACE_S)
        _close_quietly(raw, sock)
        reader.join(1.0)
        exit_code = self._exit_code(exec_id)
        duration = time.monotonic() - t0
        if exit_code is None:
            exit_code = 137 if host_killed else -1
        timed_out = host_killed or (exit_code in TIMEOUT_EXIT_CODES and duration >= timeout * 0.98)
        output, truncated = buf.result()
        return ExecResult(exit_code=exit_code, output=output, timed_out=timed_out,
                          truncated=truncated, duration_s=duration)

    def _exit_code(self, exec_id: str) -> int | None:
        for _ in range(50):   # the stream can end a moment before the engine records the exit
            try:
                info = self._client.api.exec_inspect(exec_id)
            except docker.errors.DockerException:
                return None
            if not info.get("Running"):
                return info.get("ExitCode")
            time.sleep(0.02)
        return None

    def _exec_quiet(self, argv: list[str]) -> None:
        """Fire-and-wait a tiny helper command, ignoring every error."""
        try:
            eid = self._client.api.exec_create(self._container.id, argv)["Id"]
            self._client.api.exec_start(eid)
        except docker.errors.DockerException:
            pass

    def _backstop_kill(self, exec_id: str, token: str) -> None:
        """Kill the exec's process group inside the container, and its host pid if visible."""
        self._exec_quiet(["bash", "-c", _KILL_SCRIPT, "horizon-kill", token])
        try:
            pid = int(self._client.api.exec_inspect(exec_id).get("Pid") or 0)
        except docker.errors.DockerException:
            return
        if pid > 0:
            try:   # only if that host pid really is in our container (same pid namespace)
                with open(f"/proc/{pid}/cgroup") as f:
                    if self._container.id in f.read():
                        os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    # -- files ----------------------------------------------------------------------------
    def read_file(self, path: str) -> bytes:
        """Bytes of the regular file at absolute `path` (symlinks followed)."""
        self._check_open()
        path = _abs(path)
        for _ in range(16):
            try:
                stream, _stat = self._container.get_archive(path)
                data = b"".join(stream)
            except docker.errors.NotFound as e:
                if self._container_gone():
                    raise self._engine_error(f"read_file({path})", e) from e
                raise SandboxFileNotFoundError(f"no such file in sandbox: {path}") from e
            except docker.errors.DockerException as e:
                raise self._engine_error(f"read_file({path})", e) from e
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                member = tar.next()
                if member is None:
                    raise SandboxError(f"read_file({path}): empty archive")
                if member.issym():
                    path = posixpath.normpath(posixpath.join(posixpath.dirname(path), member.linkname))
                    continue
                if member.isdir():
                    raise SandboxError(f"read_file({path}): is a directory")
                f = tar.extractfile(member)
                if f is None:
                    raise SandboxError(f"read_file({path}): not a regular file")
                return f.read()
        raise SandboxError(f"read_file({path}): too many levels of symbolic links")

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create/overwrite `path` (parent dirs created), owned by the sandbox user."""
        self._check_open()
        path = _abs(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        parent, name = posixpath.split(path)
        if not name:
            raise SandboxError(f"write_file: {path!r} names a directory")
        tar_bytes = io.BytesIO()
        with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), mode, int(time.time())
            info.uid, info.gid, info.uname, info.gname = self.uid, self.gid, "", ""
            tar.addfile(info, io.BytesIO(payload))
        blob = tar_bytes.getvalue()
        for attempt in range(2):
            try:
                self._container.put_archive(parent, blob)
                return
            except docker.errors.NotFound as e:
                if attempt or self._container_gone():
                    raise self._engine_error(f"write_file({path})", e) from e
                r = self.exec(f"mkdir -p -- {_shq(parent)}", timeout=30, workdir="/")
                if r.exit_code != 0:
                    raise SandboxError(f"write_file({path}): cannot create {parent}: {r.output.strip()}") from e
            except docker.errors.DockerException as e:
                raise self._engine_error(f"write_file({path})", e) from e

    def _container_gone(self) -> bool:
        try:
            self._container.reload()
            return self._container.status not in ("running", "created")
        except docker.errors.NotFound:
            return True

    # -- snapshot / fork ------------------------------------------------------------------
    def snapshot(self, tag: str | None = None) -> str:
        """Commit the filesystem to a labelled image; returns its id (usable by `fork`/`create`)."""
        return self._snapshot(tag, owned=not self._spec["keep_snapshots"])

    def _snapshot(self, tag: str | None, owned: bool) -> str:
        self._check_open()
        self._snap_count += 1
        tag = re.sub(r"[^A-Za-z0-9_.-]", "-", tag or f"{SESSION_ID}-{self._container.short_id}-{self._snap_count}")[:120]
        labels = {**self._spec["labels"], **self._owner_labels("snapshot")}
        try:
            img = self._container.commit(repository=SNAPSHOT_REPO, tag=tag, conf={"Labels": labels})
            if len(img.attrs.get("RootFS", {}).get("Layers", [])) > self._spec["flatten_after"]:
                img = self._flatten(img, tag, labels)
        except docker.errors.DockerException as e:
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
        stream = self._container.export()
        self._client.api.import_image_from_data(_IterReader(stream), repository=SNAPSHOT_REPO, tag=tag,
                                                changes=changes)
        flat = self._client.images.get(f"{SNAPSHOT_REPO}:{tag}")
        if flat.id != deep_image.id:
            _remove_images_repeatedly(self._client, [deep_image.id])
        return flat

    def fork(self, *, workspace_only: bool = False) -> "DockerSandbox":
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
            child = DockerSandbox.create(ref, client=self._client, **spec)
            child._owned_images.append(ref)   # the fork's private snapshot goes with the fork
            return child
        self._check_open()
        try:
            stream, _ = self._container.get_archive(WORKSPACE)
            data = b"".join(stream)
        except docker.errors.DockerException as e:
            raise self._engine_error("fork failed", e) from e
        child = DockerSandbox.create(self.image, client=self._client, **spec)
        try:
            r = child.exec(f"find {WORKSPACE} -mindepth 1 -delete", timeout=60, workdir="/")
            if r.exit_code != 0:
                raise SandboxError(f"fork: cannot clear the child's workspace: {r.output.strip()}")
            child._container.put_archive(posixpath.dirname(WORKSPACE), data)
        except BaseException:
            child.close()
            raise
        return child

    @classmethod
    def from_snapshot(cls, ref: str, **kwargs) -> "DockerSandbox":
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


def _drain(sock, buf: OutputBuffer) -> None:
    """Reader thread: demultiplex the exec stream into `buf` until EOF or socket close."""
    try:
        for _stream, data in frames_iter(sock, tty=False):
            buf.feed(data)
    except (OSError, ValueError):
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


def _abs(path: str) -> str:
    if not path.startswith("/"):
        raise SandboxError(f"sandbox paths must be absolute, got {path!r}")
    return posixpath.normpath(path)


def _shq(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"
