"""The in-box executor (docs/SANDBOX.md): what the agent user cannot reach, whose failure a dead
executor is, concurrent commands on one box, and parity with one `docker exec` per action."""

import threading

import pytest

from horizon.sandbox import SandboxInfraError

docker_only = pytest.mark.docker


@pytest.fixture
def pair(docker_make):
    """The same image and limits, one box per executor."""
    return (docker_make(executor="inbox", max_output_bytes=2000),
            docker_make(executor="docker-exec", max_output_bytes=2000))


PARITY_COMMANDS = [
    "env | sort",
    "id; umask; ulimit -f; ulimit -n; pwd; echo $0",
    "echo out; exit 3",
    "echo err >&2; exit 4",
    "cat; echo after-stdin",                           # stdin is empty (EOF at once)
    "printf 'bad \\xff\\xfe bytes\\n'",
    "yes 0123456789 | head -c 100000",                 # truncated to head + tail
    "cd /root",
    "bash -c 'kill -TERM $$'",
    "ls -ld /workspace /tmp; touch /etc/x",
    "sleep 30 & echo background-left",                 # the exec returns; the sleep stays until prepare
]


@docker_only
@pytest.mark.parametrize("cmd", PARITY_COMMANDS)
def test_same_observation_as_one_docker_exec(pair, cmd):
    inbox, plain = pair
    a, b = inbox.exec(cmd, timeout=20), plain.exec(cmd, timeout=20)
    strip = (lambda s: "\n".join(x for x in s.splitlines() if not x.startswith("HOSTNAME="))) if "env" in cmd else str
    assert (a.exit_code, strip(a.output), a.timed_out, a.truncated) == (b.exit_code, strip(b.output), b.timed_out,
                                                                         b.truncated)


@docker_only
def test_stdout_and_stderr_keep_their_write_order(pair):
    """One pipe for both streams keeps the order the command wrote them in; Docker's exec stream
    carries them as separate frames whose order can swap (the docker-exec path: same lines)."""
    cmd = "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; done"
    a, b = (sb.exec(cmd) for sb in pair)
    assert a.output.split() == [f"{s}{i}" for i in range(1, 6) for s in ("out", "err")]
    assert sorted(b.output.split()) == sorted(a.output.split())


@docker_only
@pytest.mark.parametrize("workdir", ["/nope", "/root"])
def test_bad_workdir_reads_like_bash(pair, workdir):
    inbox, plain = pair
    a, b = inbox.exec("pwd", workdir=workdir), plain.exec("pwd", workdir=workdir)
    assert (a.exit_code, a.output) == (b.exit_code, b.output)
    assert a.exit_code == 1 and f"cd: {workdir}:" in a.output


@docker_only
def test_timeouts_and_sigterm_ignoring_commands_match(pair):
    for cmd, t in [("sleep 30", 1), ("trap '' TERM; sleep 30", 1)]:
        a, b = (sb.exec(cmd, timeout=t) for sb in pair)
        assert (a.exit_code, a.timed_out) == (b.exit_code, b.timed_out)
        assert a.timed_out and a.exit_code in (124, 137)
    assert pair[0].exec("echo still-works").output == "still-works\n"


@docker_only
def test_agent_user_cannot_signal_or_reach_the_executor(docker_make):
    sb = docker_make(executor="inbox")
    pid = sb._inbox.pid
    assert pid > 1 and sb.exec(f"ps -o user= -p {pid}").output.strip() == "root"
    r = sb.exec(f"kill -9 {pid}; kill -STOP {pid}")
    assert r.exit_code != 0 and "Operation not permitted" in r.output
    # its pipes (the stream to the host) cannot be opened, listed or written through /proc
    r = sb.exec(f"ls /proc/{pid}/fd; cat /proc/{pid}/environ; echo x > /proc/{pid}/fd/0; "
                f"echo x > /proc/{pid}/fd/1; cat /proc/{pid}/fd/1")
    assert "Permission denied" in r.output
    assert r.output.count("Permission denied") >= 5 and "x" not in r.output.replace("/proc", "")
    # nothing it holds is a socket or file the user could open
    assert sb.exec("find / -xdev -type s 2>/dev/null | wc -l").output.strip() == "0"
    sb.exec("kill -9 -1")
    assert sb._inbox.pid == pid and sb.exec("echo alive").output == "alive\n"


@docker_only
def test_executor_killed_from_outside_is_infra_then_restarted(docker_make):
    sb = docker_make(executor="inbox")
    pid = sb._inbox.pid
    killer = threading.Timer(1.0, lambda: sb.container.exec_run(["kill", "-9", str(pid)], user="0:0"))
    killer.start()
    with pytest.raises(SandboxInfraError, match="in-box executor .* died"):
        sb.exec("sleep 10; echo never", timeout=30)
    killer.join()
    assert sb.alive()
    assert sb.exec("echo back").output == "back\n" and sb._inbox.pid != pid
    sb.prepare()


@docker_only
def test_concurrent_commands_on_one_box_keep_their_outputs_apart(docker_make):
    sb = docker_make(executor="inbox", max_output_bytes=1 << 20)
    n = 6
    # each command waits for every other one's flag file: only concurrent commands can all finish
    cmd = ("touch /tmp/flag{i}; for j in $(seq 0 {last}); do "
           "until [ -e /tmp/flag$j ]; do sleep 0.01; done; done; for k in $(seq 500); do echo tag{i}-$k; done")
    results = [None] * n

    def run(i):
        results[i] = sb.exec(cmd.format(i=i, last=n - 1), timeout=60)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, r in enumerate(results):
        assert r.ok and r.output.splitlines() == [f"tag{i}-{k}" for k in range(1, 501)]


@docker_only
def test_image_without_python_falls_back_to_docker_exec(docker_make, docker_image):
    import docker

    client = docker.from_env()
    tag = "horizon-test-nopython:latest"
    c = client.containers.run(docker_image, ["bash", "-c", "rm -f /usr/bin/python3*"], user="0:0", detach=True)
    try:
        c.wait()
        c.commit(repository="horizon-test-nopython", tag="latest", conf={"User": "1000:1000",
                                                                       "Labels": {"horizon.sandbox": "1"}})
    finally:
        c.remove(force=True)
    try:
        sb = docker_make(executor="auto")
        assert sb.executor == "inbox"
        from horizon.sandbox.docker import DockerSandbox

        nopy = DockerSandbox.create(tag, labels=sb._spec["labels"])
        try:
            assert nopy.executor == "docker-exec" and nopy.exec("echo ok").output == "ok\n"
        finally:
            nopy.close()
        with pytest.raises(SandboxInfraError, match="in-box executor"):
            DockerSandbox.create(tag, executor="inbox", labels=sb._spec["labels"])
    finally:
        client.images.remove(tag, force=True)


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return (type(e).__name__, str(e))


@docker_only
def test_file_operations_fail_the_same_way(pair):
    blob = bytes(range(256)) * 64
    for sb in pair:
        sb.exec("mkdir -p /workspace/d && ln -sf /etc/shadow /workspace/shadow_link && mkfifo /workspace/fifo")
    ops = [
        lambda sb: sb.read_file("/workspace/missing"),
        lambda sb: sb.read_file("/workspace/d"),
        lambda sb: sb.read_file("/etc/shadow"),
        lambda sb: sb.read_file("/workspace/shadow_link"),
        lambda sb: sb.read_file("/workspace/fifo"),
        lambda sb: sb.write_file("/etc/passwd", "x"),
        lambda sb: sb.write_file("/workspace/d", "x"),
        lambda sb: sb.write_file("/etc/newdir/f", "x"),
        lambda sb: (sb.write_file("/workspace/a/b/c.bin", blob, mode=0o600), sb.read_file("/workspace/a/b/c.bin"),
                    sb.exec("stat -c %a /workspace/a/b/c.bin").output),
    ]
    for op in ops:
        assert _outcome(lambda op=op: op(pair[0])) == _outcome(lambda op=op: op(pair[1]))
