"""A Docker sandbox's actions as one `docker exec` each: the path before the in-box executor,
kept for images without python3 >= 3.9 and as the baseline `benchmarks/sandbox.py --baseline
docker-exec` measures against (docs/SANDBOX.md).

A command runs as `timeout -k 2 N bash -c CMD` (exec has no timeout of its own and killing the
client leaves the process running); the output stream is read in a thread with a host-side
deadline, and as a backstop the exec's process group is killed. The container's state and a
probe exec also serve the in-box path: they tell a dead container apart from a dead executor.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid

from docker.utils.socket import frames_iter

from horizon.sandbox.base import KILL_GRACE_S, OutputBuffer, SandboxInfraError
from horizon.sandbox.engine import ENGINE_ERRORS
from horizon.sandbox.scripts import EXEC_SCRIPT, KILL_SCRIPT, OOM_SCRIPT

HOST_DEADLINE_SLACK_S = 5.0   # host waits timeout + KILL_GRACE_S + this before the backstop


class DockerExecPath:
    """Mixin of `DockerSandbox`: actions as plain `docker exec`s and the container-state checks.
    Needs `_client`, `_container`, `user`, `_engine_error` and `_fsize_kib`."""

    def _state(self, what: str) -> dict:
        """The container's State; SandboxInfraError if it is gone or the engine fails."""
        try:
            return self._client.api.inspect_container(self._container.id).get("State") or {}
        except ENGINE_ERRORS as e:
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
                eid = self._client.api.exec_create(self._container.id, ["bash", "-c", OOM_SCRIPT],
                                                   user=self.user, workdir="/")["Id"]
                out = self._client.api.exec_start(eid)
                if self._exit_code(eid) == 0:
                    return out
            except ENGINE_ERRORS:
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
        except ENGINE_ERRORS as e:
            raise self._engine_error(what, e) from e
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(None)   # no client-side read timeout on the stream: our deadlines govern
        return exec_id, sock

    def _exec_docker(self, cmd: str, timeout: float, workdir: str, cap: int) -> tuple[int | None, OutputBuffer, bool]:
        """`cmd` through one `docker exec` of the wrapper (module docstring):
        (exit code or None if the engine has none, output, whether the host backstop fired)."""
        token = uuid.uuid4().hex
        argv = ["bash", "-c", EXEC_SCRIPT, "horizon-exec", cmd, workdir, f"{timeout:.3f}", token,
                str(KILL_GRACE_S), str(self._fsize_kib())]
        exec_id, sock = self._start_exec(argv, "exec failed")
        raw = getattr(sock, "_sock", sock)
        buf = OutputBuffer(cap)
        reader = threading.Thread(target=_drain, args=(sock, buf), daemon=True)
        reader.start()
        reader.join(timeout + KILL_GRACE_S + HOST_DEADLINE_SLACK_S)
        host_killed = reader.is_alive()
        if host_killed:   # `timeout` itself is stuck or the stream hangs: backstop kill
            self._backstop_kill(exec_id, token)
            reader.join(KILL_GRACE_S)
        _close_quietly(raw, sock)
        reader.join(1.0)
        return self._exit_code(exec_id), buf, host_killed

    def _exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code once the engine has it; None if it has none (or fails)."""
        delay = 0.002
        deadline = time.monotonic() + 2.0
        while True:   # the stream can end a moment before the engine records the exit
            try:
                info = self._client.api.exec_inspect(exec_id)
            except ENGINE_ERRORS:
                return None
            if not info.get("Running"):
                return info.get("ExitCode")
            if time.monotonic() > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _run_docker(self, argv: list[str], *, what: str, timeout: float, stdin: bytes | None = None,
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
        except ENGINE_ERRORS:
            pass

    def _backstop_kill(self, exec_id: str, token: str) -> None:
        """Kill the exec's process group inside the container, and its host pid if visible."""
        self._exec_quiet(["bash", "-c", KILL_SCRIPT, "horizon-kill", token])
        try:
            pid = int(self._client.api.exec_inspect(exec_id).get("Pid") or 0)
        except ENGINE_ERRORS:
            return
        if pid > 0:
            try:   # only if that host pid really is in our container (same pid namespace)
                with open(f"/proc/{pid}/cgroup") as f:
                    if self._container.id in f.read():
                        os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass



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


