"""The real-repository generator in containers (SPEC §5, §7; issue 26 item 2). Marked `docker`.

Two repositories of the manifest (parse, inflection: the fastest suites) are fetched (pip on the
host, sha256-checked; the sdists are reused from envs/.build/repos/sdists when there), built into
repository images (reused when current), screened twice, and 6 candidates each validated in Docker
into at most 3 instances each (images labelled with this run and removed after). The instances are
written as SWE-bench JSONL, read back through `swebench.load_swebench` and graded by
`swebench.grade`: gold patch 1.0, empty patch 0.0. A second generation is incremental (every
verdict cached, every image current). The full build over every repository is slow-marked.
"""

import shutil
import time
import uuid

import pytest

from horizon.tasks import generate, open_task_sandbox, repos, swebench, verify

pytestmark = pytest.mark.docker
RUN_ID = uuid.uuid4().hex[:8]
NAMES = ("parse", "inflection")
TEST_IMAGE_REPO = "horizon-swegen-test"


@pytest.fixture(scope="module")
def generated(docker_ready, tmp_path_factory):
    import docker

    root = tmp_path_factory.mktemp("repos")
    shared = repos.BUILD_ROOT / "sdists"
    if shared.is_dir():
        shutil.copytree(shared, root / "sdists")
    labels = {"horizon.test_run": RUN_ID}
    out, reports, t0 = [], [], time.monotonic()
    for spec in repos.select(repos.load_manifest(), NAMES):
        _, image_labels = repos.build_repo_image(spec, root=root)
        base = repos.screen_suite(spec, image_labels, root=root)
        kw = dict(n_candidates=6, seed=1, max_instances=3, root=root, extra_labels=labels, image_repo=TEST_IMAGE_REPO)
        got, rep = generate.generate_repo(spec, base, **kw)
        again, rep2 = generate.generate_repo(spec, base, **kw)
        assert [i.instance_id for i in again] == [i.instance_id for i in got]
        assert rep2["cached"] == rep2["candidates"] == rep["candidates"] and rep2["images_built"] == 0, rep2
        out += got
        reports.append(rep)
    print(f"[test_generate_docker] built {len(out)} instances in {time.monotonic() - t0:.1f}s: {reports}")
    path = root / "instances.jsonl"
    swebench.write_jsonl(out, path)
    yield path, out, reports
    client = docker.from_env()
    for inst in out:
        client.images.remove(inst.image, force=True)


def test_reports(generated):
    _, out, reports = generated
    assert 2 <= len(out) <= 10 and {r["repo"] for r in reports} == {f"pypi/{n}" for n in NAMES}
    for r in reports:
        assert r["kept"] + sum(r["rejected"].values()) == r["candidates"] == 6 and r["validated"] == 6
        assert sum(r["kinds_tried"].values()) == 6
    assert len({i.instance_id for i in out}) == len(out)
    assert all(i.fail_to_pass and i.pass_to_pass and not set(i.fail_to_pass) & set(i.pass_to_pass) for i in out)


def test_gold_one_empty_zero(generated, docker_limits):
    path, out, _ = generated
    tasks = swebench.load_swebench(path)
    assert [t.image for t in tasks] == [i.image for i in out]
    for task in tasks:
        for patch, want in ((task.metadata["patch"], 1.0), ("", 0.0)):
            with open_task_sandbox(task, backend="docker", **docker_limits) as sb:
                if patch:
                    assert swebench.apply_patch(sb, patch).ok
                assert sb.exec("git log --oneline | wc -l", timeout=30).output.strip() == "1"
                res = verify(task, sb)
            assert not res.infra and res.reward == want, (task.id, want, res.output[:2000])


@pytest.mark.slow
def test_full_build(docker_ready):
    """Every repository of the manifest: images, baselines, 40 candidates each (envs/.build/repos)."""
    t0 = time.monotonic()
    n = 0
    for spec in repos.load_manifest():
        _, labels = repos.build_repo_image(spec)
        base = repos.screen_suite(spec, labels)
        got, rep = generate.generate_repo(spec, base, n_candidates=40, build_images=False)
        assert rep["kept"] >= 1, rep
        n += len(got)
    print(f"[test_full_build] {n} instances in {time.monotonic() - t0:.1f}s")
