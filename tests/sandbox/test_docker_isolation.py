"""Docker-only guarantees of docs/SPEC.md §5: no network egress, non-root, resource limits, cleanup."""

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from horizon.sandbox import PROJECT_LABEL, SandboxInfraError

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]


def _connect(sb, host: str, port: int) -> str:
    script = ("import socket\ns = socket.socket(); s.settimeout(3)\n"
              f"try:\n    s.connect(({host!r}, {port})); print('CONNECTED')\n"
              "except OSError as e:\n    print('FAILED', type(e).__name__, e)\n")
    sb.write_file("/tmp/connect.py", script)
    return sb.exec("python3 /tmp/connect.py", timeout=15).output


def test_no_network_egress(docker_make):
    import docker

    sb = docker_make()
    # ENETUNREACH (not "refused"/"timed out"): there is no route off the loopback at all.
    out = _connect(sb, "1.1.1.1", 53)
    assert out.startswith("FAILED") and "unreachable" in out, out
    ipam = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"][0]
    gateway = ipam.get("Gateway") or str(next(ipaddress.ip_network(ipam["Subnet"]).hosts()))
    out = _connect(sb, gateway, 2375)   # the host side of docker0
    assert out.startswith("FAILED") and "unreachable" in out, out
    assert _connect(sb, "127.0.0.1", 9).startswith("FAILED ConnectionRefused")   # lo works
    assert sb.exec("ls /sys/class/net").output.split() == ["lo"]
    assert "lo:" in sb.exec("cat /proc/net/dev").output
    assert sb.container.attrs["HostConfig"]["NetworkMode"] == "none"


def test_runs_unprivileged(docker_make):
    sb = docker_make()
    assert sb.exec("id -u; id -g").output.split() == ["1000", "1000"]
    assert sb.exec("touch /etc/owned").exit_code != 0     # not root
    assert sb.exec("grep CapEff /proc/self/status").output.split()[1] == "0" * 16
    assert sb.exec("grep NoNewPrivs /proc/self/status").output.split()[1] == "1"
    assert sb.exec("ps -o comm= -p 1").output.strip() == "docker-init"   # init reaps zombies


def test_resource_limits_set_and_enforced(docker_make):
    sb = docker_make(cpus=0.5, mem_limit="128m", pids_limit=64)
    hc = sb.container.attrs["HostConfig"]
    assert hc["Memory"] == 128 * 2**20 and hc["MemorySwap"] == 128 * 2**20   # no swap escape
    assert hc["PidsLimit"] == 64 and hc["NanoCpus"] == 5 * 10**8
    assert hc["CapDrop"] == ["ALL"] and "no-new-privileges" in hc["SecurityOpt"][0]
    assert hc["Init"] is True
    # Allocating 400 MB under a 128 MB cap gets the process OOM-killed (137), not the sandbox.
    r = sb.exec("python3 -c \"b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('ALLOC')\"",
                timeout=30)
    assert r.exit_code == 137 and "ALLOC" not in r.output and not r.timed_out
    assert sb.exec("echo alive").output == "alive\n"


def test_dead_container_raises_clear_error(docker_make):
    sb = docker_make()
    sb.container.remove(force=True)   # removed behind the sandbox's back
    with pytest.raises(SandboxInfraError, match="no longer exists"):
        sb.exec("true")
    with pytest.raises(SandboxInfraError, match="no longer exists"):
        sb.read_file("/workspace/x")
    with pytest.raises(SandboxInfraError, match="no longer exists"):
        sb.write_file("/workspace/x", "1")
    assert not sb.alive()
    sb.close()   # still fine


_CRASHER = """
import os, signal, sys
from concurrent.futures import ThreadPoolExecutor
from horizon.sandbox.docker import DockerSandbox
n, how, key, val = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
with ThreadPoolExecutor(4) as ex:
    list(ex.map(lambda _: DockerSandbox.create(labels={key: val}), range(n)))
print("created", flush=True)
os.kill(os.getpid(), signal.SIGKILL) if how == "kill" else os._exit(0)   # no atexit cleanup
"""


def test_cleanup_leaked_removes_crashed_owners(docker_make, run_label):
    import docker

    from horizon.sandbox.docker import LABEL_KIND, LABEL_OWNER_PID, _owner_alive, cleanup_leaked

    client = docker.from_env()
    (key, val), = run_label.items()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for how in ("exit", "kill"):   # 2 x 8 sandboxes whose owners die without cleanup
        p = subprocess.run([sys.executable, "-c", _CRASHER, "8", how, key, val], env=env,
                           capture_output=True, text=True, timeout=180)
        assert "created" in p.stdout, p.stderr
    mine = [docker_make() for _ in range(4)]   # 20 in all; these 4 have a live owner
    flt = {"label": [PROJECT_LABEL, f"{key}={val}"]}
    assert len(client.containers.list(all=True, filters=flt)) == 20
    assert cleanup_leaked(only_dead_owners=True, labels=run_label) >= 16
    left = client.containers.list(all=True, filters=flt)
    assert sorted(c.id for c in left) == sorted(sb.id for sb in mine)
    assert {c.labels[LABEL_OWNER_PID] for c in left} == {str(os.getpid())}
    assert mine[0].exec("echo ok").ok   # live owners' sandboxes were spared
    cleanup_leaked(labels=run_label)
    assert client.containers.list(all=True, filters=flt) == []
    # Crashed owners' leftovers, ours or another run's, are gone from the whole engine too.
    cleanup_leaked(only_dead_owners=True)
    everything = client.containers.list(all=True, filters={"label": f"{LABEL_KIND}=container"})
    assert [c.short_id for c in everything if not _owner_alive(c.labels)] == []


@pytest.mark.slow
def test_deep_snapshot_chain_is_flattened(docker_make):
    sb = docker_make(flatten_after=2)   # the base image has 1 layer; commits add one each
    sb.write_file("/workspace/gen.txt", b"0")
    child = sb.fork()                   # 2 layers
    child.write_file("/workspace/gen2.txt", b"1")   # (a commit without changes adds no layer)
    grandchild = child.fork()           # 3 layers > 2: flattened to one
    layers = grandchild.container.image.attrs["RootFS"]["Layers"]
    assert len(layers) == 1
    assert grandchild.read_file("/workspace/gen.txt") == b"0"
    assert grandchild.read_file("/workspace/gen2.txt") == b"1"
    assert grandchild.exec("id -u; pwd").output.split() == ["1000", "/workspace"]
    child.close()
    grandchild.close()
