"""The Docker engine side shared by every Docker sandbox (docs/SANDBOX.md): one pooled client,
the labels that mark what horizon made, and the cleanup of this process's containers and
snapshot images (close, atexit, SIGTERM/SIGHUP) and of what crashed processes left behind.

Every container/image carries `PROJECT_LABEL` plus owner pid, owner process start time, host and
session id labels; `cleanup_leaked()` removes objects whose owner is gone. Engine failures are
`SandboxInfraError` (`engine_failure` says which: gone, stopped, timeout, unreachable).
"""

from __future__ import annotations

import atexit
import io
import os
import signal
import socket
import threading
import uuid
from collections.abc import Iterable

import docker
import docker.errors
import requests.exceptions

from horizon.sandbox.base import PROJECT_LABEL, SandboxInfraError

# Label keys (all prefixed by PROJECT_LABEL so one filter finds everything we made).
LABEL_OWNER_PID = PROJECT_LABEL + ".owner_pid"
LABEL_OWNER_START = PROJECT_LABEL + ".owner_start"   # /proc start time: detects pid reuse
LABEL_OWNER_HOST = PROJECT_LABEL + ".owner_host"
LABEL_SESSION = PROJECT_LABEL + ".session"
LABEL_KIND = PROJECT_LABEL + ".kind"                 # "container" | "snapshot"

# Engine API call timeouts: a hung engine call raises SandboxInfraError after this, never hangs.
# They bound each request (connect + reading the answer), not an exec's output stream, which
# has no client read timeout (the command's own timeout and the host deadline govern it).
ENGINE_TIMEOUT_S = 60         # every call but the slow ones below
SLOW_ENGINE_TIMEOUT_S = 600   # commit / export / import (a whole container filesystem)
CLIENT_TIMEOUT_S = ENGINE_TIMEOUT_S   # (old name)
CLIENT_POOL_SIZE = 64         # connection pool >= concurrent sandbox threads

# Engine failures: docker-py raises DockerException subclasses for API errors, but lets
# requests' own errors (connection refused, read timeout) through.
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)

SESSION_ID = uuid.uuid4().hex[:12]   # this process's session (re-made after os.fork)


def _proc_start_time(pid: int) -> str:
    """Start time (clock ticks since boot) of `pid`, '' if unknown: pid + start = identity."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_labels(kind: str) -> dict[str, str]:
    """The labels of an object this process makes (`kind`: "container" | "snapshot")."""
    pid = os.getpid()
    return {PROJECT_LABEL: "1", LABEL_OWNER_PID: str(pid), LABEL_OWNER_START: _proc_start_time(pid),
            LABEL_OWNER_HOST: socket.gethostname(), LABEL_SESSION: SESSION_ID, LABEL_KIND: kind}


def owner_alive(labels: dict[str, str]) -> bool:
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
            except ENGINE_ERRORS as e:
                raise SandboxInfraError(f"cannot connect to the Docker engine: {e}") from e
            _shared_clients[slow] = client
        return client


def slow_client_for(client: docker.DockerClient) -> docker.DockerClient:
    """The long-timeout twin of the shared client; a caller's own client serves both roles."""
    return get_client(slow=True) if client is _shared_clients.get(False) else client


# ---------------------------------------------------------------------------------------
# Process-exit cleanup of this process's own containers and snapshot images.
live_sandboxes: dict = {}   # container id -> DockerSandbox: strong refs, so dropped ones still go at exit
session_images: dict[str, docker.DockerClient] = {}   # image id -> client, this process only
_registry_pid = os.getpid()
_hooks_installed = False
_hooks_lock = threading.Lock()


def _reset_after_fork() -> None:
    """In a forked child, the parent's sandboxes are not ours to clean up."""
    global SESSION_ID, _registry_pid, _hooks_installed
    SESSION_ID = uuid.uuid4().hex[:12]
    _registry_pid = os.getpid()
    live_sandboxes.clear()
    session_images.clear()
    _shared_clients.clear()
    _hooks_installed = False


os.register_at_fork(after_in_child=_reset_after_fork)


def cleanup_session() -> None:
    """Remove every container and snapshot image this process created (atexit hook)."""
    if os.getpid() != _registry_pid:
        return
    for sb in list(live_sandboxes.values()):
        try:
            sb.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    for client in set(session_images.values()):
        remove_images(client, [i for i, c in session_images.items() if c is client])
    session_images.clear()


def _on_signal(signum, frame):  # noqa: ARG001
    cleanup_session()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_signals_installed = False


def install_hooks() -> None:
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
    install_hooks()


def remove_images(client: docker.DockerClient, image_ids: Iterable[str]) -> int:
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
            except ENGINE_ERRORS:
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
        if only_dead_owners and owner_alive(c.labels):
            continue
        try:
            c.remove(force=True)
            removed += 1
        except docker.errors.NotFound:
            pass
        except ENGINE_ERRORS as e:
            if "already in progress" not in str(e):
                raise SandboxInfraError(f"cannot remove leaked container {c.short_id}: {e}") from e
    images = [im for im in client.images.list(filters={"label": [f"{LABEL_KIND}=snapshot", *extra]})
              if not (only_dead_owners and owner_alive(im.labels or {}))]
    removed += remove_images(client, [im.id for im in images])
    return removed



class IterReader(io.RawIOBase):
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


def engine_failure(what: str, e: Exception, cid: str | None = None) -> SandboxInfraError:
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

