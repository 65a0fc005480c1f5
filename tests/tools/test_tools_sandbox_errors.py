"""Built-in tools against the sandbox's file permissions and failure kinds (docs/SPEC.md §4.1
"infrastructure is not the policy").

Permission problems are the policy's doing: an error observation that says "Permission denied".
Infrastructure (`SandboxInfraError`) and budget (`SandboxResourceError`) failures are never
turned into observation text by the tools: they propagate to whoever ends the episode.
"""

import json
import uuid

import pytest

from horizon.sandbox import WORKSPACE, SandboxInfraError, SandboxResourceError
from horizon.sandbox.factory import docker_available, open_sandbox
from horizon.tools import ToolContext, ToolState, make_registry
from horizon.tools.builtin import BUILTIN_TOOLS
from horizon.tools.registry import ToolArgError

BASE_IMAGE = "horizon-sandbox:base"


@pytest.fixture(scope="module")
def dbox():
    if not docker_available():
        pytest.skip("NO DOCKER ENGINE ANSWERS: docker-marked tool tests skipped")
    import docker

    try:
        docker.from_env().images.get(BASE_IMAGE)
    except Exception:  # noqa: BLE001
        pytest.skip(f"IMAGE {BASE_IMAGE} MISSING: build it with envs/build_base_image.sh")
    sb = open_sandbox("docker", BASE_IMAGE, labels={"horizon.test_run": "tools-" + uuid.uuid4().hex[:8]})
    yield sb
    sb.close()


def run(reg, ctx, name, **args):
    return reg.execute(name, {k: v if isinstance(v, str) else json.dumps(v) for k, v in args.items()}, ctx)


@pytest.mark.docker
def test_file_tools_respect_sandbox_permissions(dbox):
    reg = make_registry(strict=True)
    ctx = ToolContext(dbox, ToolState(), timeout_s=10, max_timeout_s=10, max_observation_bytes=2000)
    passwd = dbox.read_file("/etc/passwd")
    dbox.exec(f"rm -rf {WORKSPACE}/*; ln -s /etc {WORKSPACE}/etc_link; mkdir -p {WORKSPACE}/locked/in; "
              f"chmod 000 {WORKSPACE}/locked")

    r = run(reg, ctx, "read_file", path="/etc/shadow")
    assert r.error and "Permission denied" in r.output, r.output
    r = run(reg, ctx, "edit_file", command="str_replace", path="/etc/passwd", old_str="root:x:", new_str="root::")
    assert r.error and "Permission denied" in r.output, r.output
    for path in ("/etc/evil", f"{WORKSPACE}/etc_link/evil", "/usr/bin/x"):
        r = run(reg, ctx, "edit_file", command="create", path=path, file_text="pwned")
        assert r.error and "Permission denied" in r.output, (path, r.output)
    r = run(reg, ctx, "edit_file", command="insert", path=f"{WORKSPACE}/etc_link/passwd", insert_line=0,
            new_str="evil::0:0::/:/bin/sh")
    assert r.error and "Permission denied" in r.output, r.output
    assert dbox.read_file("/etc/passwd") == passwd
    assert dbox.exec("ls /etc/evil /usr/bin/x").exit_code != 0

    # A NUL byte in a path is refused before anything runs (no file created under the prefix).
    r = run(reg, ctx, "edit_file", command="create", path=f"{WORKSPACE}/a\x00b", file_text="x")
    assert r.error and "NUL" in r.output, r.output
    assert dbox.exec(f"ls -A {WORKSPACE}").output.split() == ["etc_link", "locked"]

    # list_dir: a directory the user cannot read is an error, not a listing of error messages.
    for path in ("/root", f"{WORKSPACE}/locked"):
        r = run(reg, ctx, "list_dir", path=path)
        assert r.error and "Permission denied" in r.output, (path, r.output)
    r = run(reg, ctx, "list_dir", path=WORKSPACE)   # an unreadable subdirectory is still listed
    assert not r.error and f"{WORKSPACE}/locked/" in r.output, r.output
    r = run(reg, ctx, "list_dir", path=f"{WORKSPACE}/etc_link/hostname")
    assert r.error and "not a directory" in r.output
    r = run(reg, ctx, "read_file", path=f"{WORKSPACE}/etc_link/hostname")   # symlinks resolve inside
    assert not r.error and r.output == "     1\tsandbox"
    dbox.exec(f"chmod 755 {WORKSPACE}/locked")


class _FailingSandbox:
    """A sandbox whose every operation fails with `exc` (the engine / a budget gave out)."""

    def __init__(self, exc):
        self.exc = exc

    def exec(self, *a, **k):
        raise self.exc

    def read_file(self, *a, **k):
        raise self.exc

    def write_file(self, *a, **k):
        raise self.exc


@pytest.mark.parametrize("exc", [SandboxInfraError("container died"),
                                 SandboxResourceError("[sandbox] disk budget exceeded: 70 MiB > 64 MiB")])
def test_infra_and_resource_errors_are_not_turned_into_observations(exc):
    ctx = ToolContext(_FailingSandbox(exc), ToolState())
    calls = [("read_file", dict(path="/workspace/a.py")),
             ("edit_file", dict(command="create", path="/workspace/a.py", file_text="x")),
             ("edit_file", dict(command="str_replace", path="/workspace/a.py", old_str="a", new_str="b")),
             ("run_shell", dict(command="true")),
             ("grep", dict(pattern="x")),
             ("list_dir", dict())]
    for name, args in calls:
        with pytest.raises(type(exc)):
            BUILTIN_TOOLS[name].fn(ctx, **args)
    with pytest.raises(ToolArgError, match="NUL"):   # argument errors stay the policy's
        BUILTIN_TOOLS["read_file"].fn(ctx, path="/workspace/a\x00")
