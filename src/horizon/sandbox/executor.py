"""The host side of a Docker sandbox's in-box executor (`horizon.sandbox.inbox`): one attached
`docker exec` stream per box, requests multiplexed over it by id (docs/SANDBOX.md).

`InboxClient.start` runs the executor as root (`python3 -I -S -u -c <inbox source>`, working
directory /, nothing the sandbox user can write on its import path) and waits for its ready
frame; a reader thread demultiplexes the stream (stdout: response frames, stderr: the
executor's own diagnostics, kept for error messages) and wakes each caller. When the stream
ends every pending and later call raises `InboxLost`: the caller (DockerSandbox) decides whose
failure that was (container death, an outside kill, the memory limit).
"""

from __future__ import annotations

import itertools
import json
import pathlib
import re
import socket
import struct
import sys
import threading
import time

from docker.utils.socket import frames_iter

from horizon.sandbox import inbox
from horizon.sandbox.base import KILL_GRACE_S, WORKSPACE, OutputBuffer, SandboxInfraError, meter_of
from horizon.sandbox.docker_exec import HOST_DEADLINE_SLACK_S
from horizon.sandbox.engine import ENGINE_ERRORS
from horizon.sandbox.scripts import oom_count

SOURCE = pathlib.Path(inbox.__file__).read_text()
ARGV = ["python3", "-I", "-S", "-u", "-c", SOURCE]
READY_TIMEOUT_S = 30.0   # an executor that has not said "ready" by then is not coming
INBOX_SLACK_S = 10.0     # host waits an executor's own deadline + this before calling it hung
_no_inbox_images: set[str] = set()   # images already reported as falling back to docker exec
_HEADER = struct.Struct(">I")


class InboxUnavailable(RuntimeError):
    """The executor could not start in this image (no python3 >= 3.9, or it exited at once)."""


class InboxLost(RuntimeError):
    """The executor's stream ended (the executor or its container died) or it stopped answering."""


class _Call:
    __slots__ = ("done", "hdr", "out", "err")

    def __init__(self):
        self.done = threading.Event()
        self.hdr: dict | None = None
        self.out = b""
        self.err = b""


class InboxClient:
    """One box's executor: `call()` is thread-safe and concurrent calls run concurrently."""

    def __init__(self, sock, exec_id: str):
        self._sock = sock
        self._raw = getattr(sock, "_sock", sock)
        self.exec_id = exec_id
        self._ids = itertools.count(1)
        self._pending: dict[int, _Call] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stderr = bytearray()
        self._buf = bytearray()
        self.lost: str | None = None          # why the stream ended, once it has
        self.ready = _Call()
        self._pending[0] = self.ready
        self._reader = threading.Thread(target=self._read, daemon=True, name="inbox-reader")
        self._reader.start()

    @classmethod
    def start(cls, api, container_id: str, *, home_from_passwd: bool, fsize_kib: int = 0,
              ready_timeout: float = READY_TIMEOUT_S) -> InboxClient:
        """Start the executor in `container_id` (engine errors propagate as docker-py raises them).
        `home_from_passwd`: the container's config sets no HOME (the user's comes from passwd);
        `fsize_kib`: every command's file size cap (the disk budget; 0 = none)."""
        env = {"HORIZON_INBOX_HOME": "1" if home_from_passwd else "0", "HORIZON_INBOX_FSIZE_KIB": str(int(fsize_kib))}
        exec_id = api.exec_create(container_id, ARGV, stdin=True, stdout=True, stderr=True, user="0:0",
                                  workdir="/", environment=env)["Id"]
        sock = api.exec_start(exec_id, socket=True)
        getattr(sock, "_sock", sock).settimeout(None)
        client = cls(sock, exec_id)
        if not client.ready.done.wait(ready_timeout) or client.ready.hdr is None:
            why = client.lost or f"no ready frame within {ready_timeout:g} s"
            client.close()
            raise InboxUnavailable(f"{why}; executor stderr: {client.stderr_tail()!r}")
        client.pid = int(client.ready.hdr.get("pid") or 0)
        client.oom_kill = client.ready.hdr.get("oom_kill")
        return client

    def stderr_tail(self, n: int = 500) -> str:
        return bytes(self._stderr[-n:]).decode("utf-8", "replace")

    def call(self, req: dict, stdin: bytes = b"", *, timeout: float) -> tuple[dict, bytes, bytes]:
        """Send `req` (+ `stdin`), wait up to `timeout` s: (header, stdout, stderr) or `InboxLost`."""
        c = _Call()
        with self._lock:
            if self.lost is not None:
                raise InboxLost(self.lost)
            rid = next(self._ids)
            self._pending[rid] = c
        blob = json.dumps(dict(req, id=rid, stdin_len=len(stdin))).encode()
        try:
            with self._send_lock:
                self._raw.sendall(_HEADER.pack(len(blob)) + blob + stdin)
        except OSError as e:
            self._fail(f"cannot write to the executor's stream: {e}")
        if not c.done.wait(timeout):
            with self._lock:
                self._pending.pop(rid, None)
            raise InboxLost(f"the executor did not answer within {timeout:g} s")
        if c.hdr is None:
            raise InboxLost(self.lost or "the executor's stream ended")
        return c.hdr, c.out, c.err

    def _read(self) -> None:
        why = "the executor's stream ended"
        try:
            for stream, data in frames_iter(self._sock, tty=False):
                if stream == 2:
                    self._stderr += data
                    del self._stderr[:-4096]
                    continue
                self._buf += data
                self._parse()
        except (OSError, ValueError) as e:
            why = f"the executor's stream failed: {e}"
        self._fail(why)

    def _parse(self) -> None:
        buf = self._buf
        while len(buf) >= _HEADER.size:
            n = _HEADER.unpack_from(buf)[0]
            if len(buf) < _HEADER.size + n:
                return
            hdr = json.loads(bytes(buf[_HEADER.size:_HEADER.size + n]))
            start = _HEADER.size + n
            lo, le = int(hdr.get("out_len", 0)), int(hdr.get("err_len", 0))
            if len(buf) < start + lo + le:
                return
            out, err = bytes(buf[start:start + lo]), bytes(buf[start + lo:start + lo + le])
            del buf[:start + lo + le]
            with self._lock:
                c = self._pending.pop(int(hdr.get("id", -1)), None)
            if c is not None:
                c.hdr, c.out, c.err = hdr, out, err
                c.done.set()

    def _fail(self, why: str) -> None:
        with self._lock:
            if self.lost is None:
                self.lost = why
            pending, self._pending = list(self._pending.values()), {}
        for c in pending:
            c.done.set()

    def close(self) -> None:
        """End the stream (the executor exits on EOF; its container's removal ends it anyway)."""
        self._fail("the executor was closed")
        for fn in (lambda: self._raw.shutdown(socket.SHUT_RDWR), self._raw.close, self._sock.close):
            try:
                fn()
            except (OSError, AttributeError):
                pass

    def wait_closed(self, timeout: float = 1.0) -> None:
        t = time.monotonic() + timeout
        self._reader.join(max(0.0, t - time.monotonic()))


def parse_user(user: str) -> tuple[int, int]:
    """Numeric uid/gid ("1000:1000" -> (1000, 1000)); the sandbox user must be numeric."""
    m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    if not m:
        raise ValueError(f"user must be numeric 'uid[:gid]' (e.g. '1000:1000'), got {user!r}")
    uid = int(m.group(1))
    return uid, int(m.group(2) or uid)


class InboxPath:
    """Mixin of `DockerSandbox`: its actions through the in-box executor (module docstring), with
    the docker-exec path (`DockerExecPath`) where the image cannot run one. Needs `_client`,
    `_container`, `image`, `executor`, `user`, `max_output_bytes`, `_inbox`, `_inbox_lock`,
    `_home_from_passwd`, `_oom_kills`, `_fsize_kib`, `_oom_killed`, `_oom_note`, `_raise_if_dead`,
    `_run_docker` and `_engine_error`."""

    def _start_inbox(self) -> None:
        """Start the executor; without python3 >= 3.9 in the image, "auto" falls back to docker exec."""
        try:
            self._inbox = InboxClient.start(self._client.api, self._container.id,
                                            home_from_passwd=self._home_from_passwd, fsize_kib=self._fsize_kib())
        except InboxUnavailable as e:
            if self.executor == "inbox" or self._inbox_used:
                raise SandboxInfraError(f"sandbox {self._container.short_id}: the in-box executor does not start: "
                                        f"{e}") from e
            self.executor = "docker-exec"
            if self.image not in _no_inbox_images:
                _no_inbox_images.add(self.image)
                print(f"[sandbox] image {self.image!r} has no usable python3 for the in-box executor ({e}); "
                      "one docker exec per action", file=sys.stderr, flush=True)
            return
        except ENGINE_ERRORS as e:
            raise self._engine_error("cannot start the in-box executor", e) from e
        self._inbox_used = True
        self.executor = "inbox"
        if self._inbox.oom_kill is not None:
            self._oom_kills = int(self._inbox.oom_kill)

    _inbox_used = False   # once an executor ran here, failing to start another is infra

    def _call(self, req: dict, stdin: bytes, what: str, wait: float) -> tuple[dict, bytes, bytes] | None:
        """One request to the executor (restarted first if an earlier one died): its response, or
        None when the OOM killer took the executor with the command (the policy's memory use).
        A dead container or an executor killed from outside or hung: `SandboxInfraError`."""
        with self._inbox_lock:
            if self._inbox is None:
                self._start_inbox()
            client = self._inbox
        try:
            return client.call(req, stdin, timeout=wait)
        except InboxLost as e:
            with self._inbox_lock:
                if self._inbox is client:
                    self._inbox = None     # the next action starts a fresh executor
            client.close()
            probe = self._raise_if_dead(what)   # a dead container: infra, with the container's state
            if self._oom_killed(oom_count(probe)):
                return None
            raise SandboxInfraError(f"{what}: the in-box executor of sandbox {self._container.short_id} died while "
                                    f"the command ran ({e}; executor stderr: {client.stderr_tail(200)!r})") from e

    def _raise_if_executor_failed(self, hdr: dict, what: str) -> None:
        if hdr.get("error") and hdr.get("infra"):
            raise SandboxInfraError(f"{what}: sandbox {self._container.short_id}'s executor failed: {hdr['error']}")

    def _user_ids(self, user: str | None) -> list[int]:
        return list(parse_user(user or self.user))

    def _run(self, argv: list[str], *, what: str, timeout: float, stdin: bytes | None = None,
             user: str | None = None) -> tuple[int | None, bytes, bytes]:
        """Run a helper to completion: (exit code, stdout, stderr), stdin fed from `stdin`.

        The helper bounds itself (e.g. `timeout` inside); past `timeout` s the sandbox is not
        answering: SandboxInfraError. A helper that could not start (no pid left): exit code None.
        """
        if self.executor == "docker-exec":
            return self._run_docker(argv, what=what, timeout=timeout, stdin=stdin, user=user)
        r = self._call(dict(op="spawn", argv=argv, user=self._user_ids(user), deadline_s=timeout), stdin or b"",
                       what, timeout + INBOX_SLACK_S)
        if r is None:
            return 137, b"", b""
        hdr, out, err = r
        self._raise_if_executor_failed(hdr, what)
        if hdr.get("error"):
            return None, b"", hdr["error"].encode()
        if hdr.get("hung"):
            raise SandboxInfraError(f"{what}: sandbox {self._container.short_id} did not answer within {timeout:g} s")
        meter_of(self).add_inbox(float(hdr.get("run_s", 0.0)))
        return int(hdr["code"]), out, err

    def _exec_inbox(self, cmd: str, timeout: float, workdir: str) -> tuple[int, OutputBuffer, bool, bool, int | None]:
        """`cmd` through the executor: (exit code, output, backstop fired, timed out, the cgroup's
        oom_kill counter after it or None)."""
        deadline = timeout + KILL_GRACE_S + HOST_DEADLINE_SLACK_S
        # OLDPWD: what the docker-exec wrapper's `cd` from the container's working directory leaves
        req = dict(op="spawn", argv=["bash", "-c", cmd], cwd=workdir, env={"OLDPWD": WORKSPACE},
                   user=self._user_ids(None), merge=True,
                   cap=self.max_output_bytes, timeout_s=timeout, grace_s=KILL_GRACE_S, deadline_s=deadline)
        buf = OutputBuffer(self.max_output_bytes)
        r = self._call(req, b"", "exec", deadline + INBOX_SLACK_S)
        if r is None:        # the OOM killer took the executor too: the command was OOM-killed
            buf.feed(self._oom_note(buf))
            return 137, buf, False, False, None
        hdr, out, _ = r
        self._raise_if_executor_failed(hdr, "exec")
        if hdr.get("error"):   # no pid left to start the command (the policy's fork bomb)
            buf.feed(f"[sandbox] the command could not start: {hdr['error']}\n".encode())
            return 126, buf, False, False, None
        head = int(hdr.get("head_len", len(out)))
        buf.head, buf.tail, buf.total = bytearray(out[:head]), bytearray(out[head:]), int(hdr["total"])
        meter_of(self).add_inbox(float(hdr.get("run_s", 0.0)))
        return (int(hdr["code"]), buf, bool(hdr.get("hung")), bool(hdr.get("timed_out")), hdr.get("oom_kill"))
