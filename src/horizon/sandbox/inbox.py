"""The in-box executor: one long-lived root process per Docker sandbox that runs every action
(docs/SANDBOX.md "The in-box executor").

This module is shipped into the container as the source of `python3 -I -S -u -c` (stdlib only,
no horizon import) and speaks a framed protocol over its stdin/stdout, which are the one attached
`docker exec` stream of the host's `horizon.sandbox.executor.InboxClient`:

    frame    = 4-byte big-endian length of the JSON header, the header, then its payload bytes
    request  = {"id", "op": "spawn", "argv", "user": [uid, gid] | null, "cwd", "env" (extra
                variables), "merge", "cap", "timeout_s", "grace_s", "deadline_s", "stdin_len"}
               + stdin bytes                                       (also {"id", "op": "ping"})
    response = {"id", "code", "hung", "timed_out", "run_s", "total", "head_len", "omitted",
                "out_len", "err_len", "oom_kill", "error"} + stdout bytes + stderr bytes

A spawn runs `argv` as `user` (uid, gid and the user's groups set before exec; capabilities go
with root) in a new process group, with stdin fed from the payload (else /dev/null), stdout and
stderr captured apart or merged into one head+tail `OutputBuffer` of `cap` bytes, and a backstop:
past `deadline_s` the process group is SIGKILLed and `hung` is set. When the command exits, the
output already written is read and the pipes are closed (a background child that keeps them
open loses its later output, as with Docker's own exec stream). Requests run concurrently in
a pool of worker threads started up front (a fork bomb holding every pid cannot starve it of
threads); responses carry the request id.

The executor runs as root with only CAP_KILL, CAP_SETUID and CAP_SETGID, which a process
loses when it becomes the sandbox user, so the user can neither signal it nor open its
/proc entries or pipes (docs/SANDBOX.md "What the agent cannot reach").
"""

from __future__ import annotations

import errno
import functools
import json
import os
import pwd
import queue
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time

_HEADER = struct.Struct(">I")
WORKERS = 8                       # threads started up front (more are tried when all are busy)
_OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
_READ = 1 << 16
DRAIN_S = 0.05                    # after the exit: bound on reading a background child's output


class OutputBuffer:
    """Keeps the first and last `max_bytes // 2` bytes of a stream (docs/SPEC.md §5 output limits).

    Tools show the model the head (the command's start, e.g. a traceback's first frames)
    and the tail (the final error / summary) with a visible truncation marker between.
    """

    MARKER = "\n[... output truncated: {omitted} bytes omitted ...]\n"

    def __init__(self, max_bytes: int):
        if max_bytes < 2:
            raise ValueError(f"max_output_bytes must be >= 2, got {max_bytes}")
        self.head_cap = max_bytes // 2
        self.tail_cap = max_bytes - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @classmethod
    def of(cls, data: bytes, max_bytes: int) -> tuple[str, bool]:
        """`result()` of a buffer fed `data` at once."""
        buf = cls(max_bytes)
        buf.feed(data)
        return buf.result()

    def kept(self) -> tuple[bytes, bytes, int]:
        """(head, tail, bytes omitted between them)."""
        return bytes(self.head), bytes(self.tail), self.total - len(self.head) - len(self.tail)

    def result(self) -> tuple[str, bool]:
        """(text, truncated): the kept bytes decoded as UTF-8 (invalid bytes replaced)."""
        head, tail, omitted = self.kept()
        if omitted <= 0:
            return (head + tail).decode("utf-8", "replace"), False
        return (head.decode("utf-8", "replace") + self.MARKER.format(omitted=omitted)
                + tail.decode("utf-8", "replace")), True


class _Sink:
    """Unbounded capture (cap 0): file reads must come back whole."""

    def __init__(self):
        self.data = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.data += chunk


def _oom_kills() -> int | None:
    """The memory cgroup's oom_kill counter (cgroup v2 or v1), None where neither is readable."""
    for path in _OOM_FILES:
        try:
            with open(path, "rb") as f:
                for line in f.read().splitlines():
                    if line.startswith(b"oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None


@functools.lru_cache(maxsize=8)
def _groups(uid: int, gid: int) -> tuple[int, ...]:
    """The user's groups from the image's /etc/group (root-owned: the user cannot change them)."""
    try:
        return tuple(sorted(set(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))))
    except KeyError:
        return (gid,)


def _identity(user) -> dict:
    """Popen arguments that make the child `user` (groups, gid, then uid, set by the child
    before exec; the kernel drops every capability when the uid leaves 0)."""
    if user is None:
        return {}
    uid, gid = int(user[0]), int(user[1])
    return dict(user=uid, group=gid, extra_groups=list(_groups(uid, gid)))


def _user_env(user) -> dict:
    return dict(_env_of(None if user is None else int(user[0])))


@functools.lru_cache(maxsize=8)
def _env_of(uid: int | None) -> tuple:
    """The environment `docker exec --user` would give: the container's, HOME from passwd
    where the container's config sets none (the host says so with HORIZON_INBOX_HOME=1)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORIZON_INBOX_")}
    if uid is not None and os.environ.get("HORIZON_INBOX_HOME") == "1":
        try:
            env["HOME"] = pwd.getpwuid(uid).pw_dir
        except KeyError:
            env["HOME"] = "/"
    return tuple(env.items())


def _search_denied(path: str, user) -> str | None:
    """Why `user` could not `cd` into `path` (the executor chdirs as root on its behalf), or None.
    Checks the mode bits of every component as the kernel would for the user (no ACLs)."""
    uid, gid = int(user[0]), int(user[1])
    groups = set(_groups(uid, gid))
    parts = [p for p in path.split("/") if p]
    for k in range(len(parts) + 1):          # "/", then each prefix, the target itself last
        cur = "/" + "/".join(parts[:k])
        try:
            st = os.stat(cur)
        except OSError as e:
            return e.strerror
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in groups else 0o001
        if not st.st_mode & bit:
            return "Permission denied"
    return None


def spawn(req: dict, stdin: bytes) -> tuple[dict, bytes, bytes]:
    """Run one request to completion: (response header, stdout, stderr)."""
    user = req.get("user")
    merge = bool(req.get("merge"))
    cap = int(req.get("cap") or 0)
    out = OutputBuffer(cap) if cap else _Sink()
    err = out if merge else _Sink()
    cwd = req.get("cwd") or "/"
    t0 = time.monotonic()
    denied = _search_denied(cwd, user) if user is not None and cwd != "/" else None
    try:
        if denied is not None:
            raise OSError(0, denied)
        proc = subprocess.Popen(
            req["argv"], stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge else subprocess.PIPE, cwd=cwd,
            env={**_user_env(user), **(req.get("env") or {})}, start_new_session=True, close_fds=True,
            **_identity(user))
    except OSError as e:
        if e.filename == cwd or denied is not None:   # like bash's `cd` (the command never ran)
            out.feed(f"horizon-exec: line 1: cd: {cwd}: {e.strerror}\n".encode())
            return _finish({"code": 1, "hung": False, "run_s": time.monotonic() - t0}, out, err, merge)
        # EAGAIN / ENOMEM: no pid or memory left (the policy's fork bomb or hog); anything else
        # (e.g. the image has no bash) is the box's
        policy = e.errno in (errno.EAGAIN, errno.ENOMEM)
        return {"error": f"cannot start {req['argv'][0]}: {e}", "infra": not policy}, b"", b""
    limit = req.get("timeout_s")
    t_term = t0 + float(limit) if limit is not None else None
    hung, signalled = _pump(proc, stdin, out, err, t0 + float(req.get("deadline_s") or 3600),
                            t_term, float(req.get("grace_s") or 2.0))
    code = proc.wait()
    code = 128 - code if code < 0 else code
    if signalled:                                    # GNU timeout's statuses: 124, or 137 after KILL
        code = 137 if signalled == "KILL" else 124
    return _finish({"code": code, "hung": hung, "timed_out": bool(signalled), "run_s": time.monotonic() - t0},
                   out, err, merge)


def _finish(hdr: dict, out, err, merge: bool) -> tuple[dict, bytes, bytes]:
    hdr = dict(hdr, total=out.total, oom_kill=_oom_kills())
    if isinstance(out, OutputBuffer):
        head, tail, omitted = out.kept()
        return dict(hdr, omitted=omitted, head_len=len(head)), head + tail, b"" if merge else bytes(err.data)
    return hdr, bytes(out.data), bytes(err.data)


def _pump(proc, stdin: bytes, out, err, deadline: float, t_term: float | None, grace: float):
    """Feed stdin and read stdout/stderr until the process exits (then what it already wrote).
    At `t_term` the process group gets SIGTERM, `grace` s later SIGKILL (the command's timeout);
    past `deadline` SIGKILL (the backstop). Returns (backstop fired, "TERM" | "KILL" | None)."""
    sel = selectors.DefaultSelector()
    fds = []
    for pipe, sink in ((proc.stdout, out), (proc.stderr, err)):
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe.fileno(), selectors.EVENT_READ, sink)
            fds.append(pipe.fileno())
    pending = memoryview(stdin)
    if proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, None)
    pidfd, waker = _exit_fd(proc)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    hung, signalled, exited = False, None, False
    t_kill = None if t_term is None else t_term + grace
    try:
        while not exited:
            now = time.monotonic()
            if t_term is not None and signalled is None and now >= t_term:
                signalled = "TERM"
                _signal_group(proc.pid, signal.SIGTERM)
            if t_kill is not None and signalled == "TERM" and now >= t_kill:
                signalled = "KILL"
                _signal_group(proc.pid, signal.SIGKILL)
            if now >= deadline:
                hung = True
                _signal_group(proc.pid, signal.SIGKILL)
                deadline = now + 1.0
            wake = [deadline] + [t for t in (t_term if signalled is None else None,
                                             t_kill if signalled == "TERM" else None) if t is not None]
            for key, _ in sel.select(max(0.0, min(wake) - time.monotonic())):
                if key.data == "exit":
                    exited = True
                elif key.data is None:          # stdin writable
                    try:
                        n = os.write(key.fd, pending[:_READ])
                        pending = pending[n:]
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:              # the command closed its stdin: its exit status says why
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(key.fd)
                        proc.stdin.close()
                elif _read_some(key.fd, key.data) is None:   # EOF
                    sel.unregister(key.fd)
        end = time.monotonic() + DRAIN_S
        for fd in fds:                           # what the command wrote before it exited
            try:
                sink = sel.get_key(fd).data
            except KeyError:
                continue
            while _read_some(fd, sink) and time.monotonic() < end:
                pass
    finally:
        sel.close()
        for fd in (pidfd, waker):
            if fd is not None:
                os.close(fd)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except OSError:
                    pass
    return hung, signalled


def _exit_fd(proc) -> tuple[int, int | None]:
    """(fd readable once `proc` exits, a second fd to close or None): a pidfd (Linux >= 5.3), else
    a pipe a waiter thread writes to (kernels or sandboxed runtimes without pidfd_open)."""
    try:
        return os.pidfd_open(proc.pid), None
    except (AttributeError, OSError):
        r, w = os.pipe()

        def wait():
            proc.wait()
            try:
                os.write(w, b"x")
            except OSError:
                pass
        threading.Thread(target=wait, daemon=True).start()
        return r, w


def _read_some(fd: int, sink) -> int | None:
    """Read what is available into `sink`: bytes read (0: nothing ready), None at EOF."""
    try:
        chunk = os.read(fd, _READ)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError:
        return None
    if not chunk:
        return None
    sink.feed(chunk)
    return len(chunk)


def _signal_group(pid: int, sig: int) -> None:
    for fn in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
        try:
            fn()
        except OSError:
            pass


class Server:
    """Reads requests from stdin, runs them in worker threads, writes responses to stdout."""

    def __init__(self, rfile, wfile):
        self.rfile, self.wfile = rfile, wfile
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.write_lock = threading.Lock()
        self.idle = 0
        self.idle_lock = threading.Lock()
        for _ in range(WORKERS):
            self._add_worker()

    def _add_worker(self) -> bool:
        try:
            threading.Thread(target=self._work, daemon=True).start()
        except RuntimeError:      # no pid left for a thread: the existing ones take the job
            return False
        with self.idle_lock:
            self.idle += 1
        return True

    def _work(self) -> None:
        while True:
            req, stdin = self.jobs.get()
            with self.idle_lock:
                self.idle -= 1
            try:
                hdr, out, err = spawn(req, stdin)
            except Exception as e:  # noqa: BLE001 - a request never kills the server; a bug here is infra
                hdr, out, err = {"error": f"executor: {type(e).__name__}: {e}", "infra": True}, b"", b""
            self.send(dict(hdr, id=req["id"]), out, err)
            with self.idle_lock:
                self.idle += 1

    def send(self, hdr: dict, out: bytes = b"", err: bytes = b"") -> None:
        hdr = dict(hdr, out_len=len(out), err_len=len(err))
        blob = json.dumps(hdr).encode()
        with self.write_lock:
            try:
                self.wfile.write(_HEADER.pack(len(blob)) + blob + out + err)
                self.wfile.flush()
            except OSError:     # the host's end of the stream is gone: nobody to serve
                os._exit(0)

    def _read_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.rfile.read(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def serve(self) -> None:
        self.send({"id": 0, "ready": True, "pid": os.getpid(), "oom_kill": _oom_kills()})
        while True:
            head = self._read_exact(_HEADER.size)
            if head is None:
                return                       # the host closed the stream: the box is going away
            req = json.loads(self._read_exact(_HEADER.unpack(head)[0]) or b"{}")
            stdin = self._read_exact(int(req.get("stdin_len") or 0)) or b""
            if req.get("op") == "ping":
                self.send({"id": req["id"], "pong": True, "oom_kill": _oom_kills()})
                continue
            with self.idle_lock:
                busy = self.idle <= 0
            if busy:
                self._add_worker()
            self.jobs.put((req, stdin))


def main() -> None:
    if sys.version_info < (3, 9):  # noqa: UP036 - the box's python, not the host's
        sys.exit("the in-box executor needs python3 >= 3.9 (Popen user/group, pidfd_open)")
    fsize = int(os.environ.get("HORIZON_INBOX_FSIZE_KIB") or 0)
    if fsize:   # every command's file size cap (the disk budget), inherited and not raisable
        import resource  # noqa: PLC0415 - only with a budget

        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize * 1024, fsize * 1024))
    Server(sys.stdin.buffer, sys.stdout.buffer).serve()


if __name__ == "__main__":
    main()
