"""The real-repository generator in containers (docs/SPEC.md §5, §7). Marked `docker`.

Two repositories of the manifest (parse, inflection: the fastest suites) are fetched (pip on the
host, sha256-checked; the sdists are reused from envs/.build/repos/sdists when there), built into
repository images (reused when current), screened twice and traced once (coverage map), and 6
single-site candidates, 2 feature deletions and 2 combinations each validated in Docker by 2
workers into at most 4 instances each (round-robin over the kinds; images labelled with this run
and removed after). inflection is held out. The instances are written as SWE-bench JSONL, read
back through `swebench.load_swebench` and graded by `swebench.grade`: gold patch 1.0, empty patch
0.0; experiments/eval.py on the held-out file with the gold and empty policies gives 1.000 and
0.000 per repository. A second generation is incremental (every verdict cached, every image
current). The full build over every repository is slow-marked (docs/PERF.md, "Real-repository task generator").
"""

import dataclasses
import json
import shutil
import time
import uuid

import pytest

from horizon.taskgen import coverage, generate, mutate, repos, validation
from horizon.tasks import open_task_sandbox, swebench, verify

pytestmark = pytest.mark.docker
RUN_ID = uuid.uuid4().hex[:8]
NAMES = ("parse", "inflection")
HELDOUT = ("inflection",)
TEST_IMAGE_REPO = "horizon-swegen-test"
OPTIONS = generate.GenOptions(n_candidates=6, n_features=2, n_combined=2, seed=1, max_instances=4, workers=2)


@pytest.fixture(scope="module")
def generated(docker_ready, tmp_path_factory):
    import docker

    root = tmp_path_factory.mktemp("repos")
    shared = repos.BUILD_ROOT / "sdists"
    if shared.is_dir():
        shutil.copytree(shared, root / "sdists")
    options = dataclasses.replace(OPTIONS, root=root, extra_labels={"horizon.test_run": RUN_ID},
                                  image_repo=TEST_IMAGE_REPO)
    splits, reports, t0 = {"train": [], "heldout": []}, [], time.monotonic()
    for spec in repos.select(repos.load_manifest(), NAMES):
        _, image_labels = repos.build_repo_image(spec, root=root)
        base = repos.screen_suite(spec, image_labels, root=root)
        split = "heldout" if spec.name in HELDOUT else "train"
        got, rep = generate.generate_repo(spec, base, options, split=split)
        again, rep2 = generate.generate_repo(spec, base, options, split=split)
        assert [i.instance_id for i in again] == [i.instance_id for i in got]
        assert rep2["cached"] == rep2["candidates"] == rep["candidates"] and rep2["images_built"] == 0, rep2
        splits[split] += got
        reports.append(rep)
    out = splits["train"] + splits["heldout"]
    print(f"[test_generate_docker] built {len(out)} instances in {time.monotonic() - t0:.1f}s:\n"
          + generate.report_table(generate.set_report(reports, splits, seconds=time.monotonic() - t0)))
    paths = {}
    for name, insts in splits.items():
        paths[name] = root / f"{name}.jsonl"
        swebench.write_jsonl(insts, paths[name])
    yield paths, out, reports
    client = docker.from_env()
    for inst in out:
        client.images.remove(inst.image, force=True)


def test_reports(generated):
    _, out, reports = generated
    assert 2 <= len(out) <= 10 and {r["repo"] for r in reports} == {f"pypi/{n}" for n in NAMES}
    for r in reports:
        assert r["kept"] + sum(r["rejected"].values()) == r["candidates"] == r["validated"] + r["cached"], r
        assert 8 <= r["candidates"] <= 10 and r["kinds_tried"].get(mutate.FEATURE_KIND) == 2, r
    assert len({i.instance_id for i in out}) == len(out)
    assert all(i.fail_to_pass and i.pass_to_pass and not set(i.fail_to_pass) & set(i.pass_to_pass) for i in out)
    kinds = {i.extra["metadata"]["kind"] for i in out}
    assert mutate.FEATURE_KIND in kinds and mutate.COMBINED_KIND in kinds, kinds
    for i in out:
        if i.extra["metadata"]["kind"] == mutate.FEATURE_KIND:     # names the function and its failing tests
            fn = i.extra["metadata"]["function"]
            assert f"`{fn}`" in i.problem_statement and i.fail_to_pass[0] in i.problem_statement
            assert "NotImplementedError" in i.problem_statement
    assert {i.split for i in out if i.repo == "pypi/inflection"} == {"heldout"}
    assert {i.split for i in out if i.repo != "pypi/inflection"} == {"train"}


def test_gold_one_empty_zero(generated, docker_limits):
    paths, out, _ = generated
    tasks = swebench.load_swebench(paths["train"]) + swebench.load_swebench(paths["heldout"])
    assert sorted(t.image for t in tasks) == sorted(i.image for i in out)
    for task in tasks:
        for patch, want in ((task.metadata["patch"], 1.0), ("", 0.0)):
            with open_task_sandbox(task, backend="docker", **docker_limits) as sb:
                if patch:
                    assert swebench.apply_patch(sb, patch).ok
                assert sb.exec("git log --oneline | wc -l", timeout=30).output.strip() == "1"
                res = verify(task, sb)
            assert not res.infra and res.reward == want, (task.id, want, res.output[:2000])


def test_eval_gold_and_empty_policies(generated, tmp_path):
    """experiments/eval.py on the held-out file: gold 1.000, empty 0.000, per repository too."""
    import importlib.util
    import pathlib

    paths, _, _ = generated
    driver = pathlib.Path(__file__).parents[2] / "experiments/eval.py"
    spec = importlib.util.spec_from_file_location("eval_driver", driver)
    drv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(drv)
    overall = drv.main(["--config=configs/eval_swegen.py", f"--config.eval.task_path={paths['heldout']}",
                        f"--config.eval.output_dir={tmp_path}",
                        "--config.eval.checkpoints=('gold=@gold','empty=@empty')"])
    acc = {o["policy"]: o["accuracy"] for o in overall}
    assert acc == {"gold": 1.0, "empty": 0.0}, acc
    per_repo = [json.loads(x) for x in (tmp_path / "per_repo.jsonl").read_text().splitlines()]
    assert {(r["policy"], r["repo"], r["accuracy"]) for r in per_repo} == {("gold", "pypi/inflection", 1.0),
                                                                          ("empty", "pypi/inflection", 0.0)}
    assert "## Per repository" in (tmp_path / "results.md").read_text()
    # the diagnosis (horizon.tasks.diagnosis): gold edits the right lines; the empty policy edits nothing
    rows = map(json.loads, (tmp_path / "per_kind.jsonl").read_text().splitlines())
    kinds = {(r["policy"], r["bug_kind"]): r for r in rows}
    gold, empty = kinds["gold", "all"], kinds["empty", "all"]
    assert (gold["right_file"], gold["right_hunk"], gold["mode/solved"]) == (1.0, 1.0, gold["episodes"])
    assert (empty["right_file"], empty["files_edited"], empty["mode/no_edit"]) == (0.0, 0.0, empty["episodes"])


def test_timeout_then_next_candidate(generated, monkeypatch):
    """A candidate that loops forever times out; the container is cleaned (its /tmp too) and the
    next candidate in the same container still gets a real verdict (the plugin is reinstalled)."""
    spec = repos.select(repos.load_manifest(), ["parse"])[0]
    root = generated[0]["train"].parent
    base = repos.screen_suite(spec, repos.build_repo_image(spec, root=root)[1], root=root)
    files, _ = swebench.repo_tree(repos.prepare_repo(spec, root), "HEAD")
    src = files["parse/__init__.py"]
    fn = "def with_pattern(pattern, regex_group_count=None):\n"
    assert fn in src
    looping = src.replace(fn, fn + "    while True:\n        pass\n", 1)
    path, line = "parse/__init__.py", src[:src.index(fn)].count("\n") + 2
    hang = mutate.Mutation("remove_statement", path, line, 4, "with_pattern", "loop", src, looping,
                           mutate.unified_diff(src, looping, path), mutate.unified_diff(looping, src, path))
    feat = next(m for m in mutate.feature_deletions(src, "parse/__init__.py") if m.function == "with_pattern")
    monkeypatch.setattr(validation, "MIN_TIMEOUT_S", 5.0)
    cov = coverage.coverage_map(spec, base, root=root)
    jobs = [(hang, coverage.tests_for(cov, base, hang)), (feat, coverage.tests_for(cov, base, feat))]
    assert all(t for _, t in jobs)
    v1, v2 = validation.validate_many(spec, dict(base, suite_s=0.5), jobs, workers=1)
    assert v1.status == "timeout" and v2.status == "kept", (v1, v2)


def test_rl_family_swebench(generated):
    """The RL loop's task source (`exp.env="swebench"`, configs/rl_swegen.py): splits from the two
    files, a pooled box switched to the instance's image and reset between episodes, and
    `rollout_batch` (the loop's batch path) grading an immediate answer 0."""
    from horizon.agent.scripted import ScriptedPolicy
    from horizon.data.tokenizer import tokenizer_from_config
    from horizon.env.families import family_from_config
    from horizon.env.rollouts import SandboxPool, rollout_batch
    from horizon.sandbox import DEFAULT_BASE_IMAGE
    from horizon.tools.format import render_final
    from horizon.utils import cli

    paths, _, _ = generated
    c = cli.parse(["--config=configs/rl_swegen.py", f"--config.exp.task.train_path={paths['train']}",
                   f"--config.exp.task.heldout_path={paths['heldout']}"], default="configs/rl_swegen.py")
    fam = family_from_config(c.exp)
    train, held = fam.tasks("train", 6), fam.tasks("heldout", 100)
    assert {t.metadata["repo"] for t in held} == {"pypi/inflection"} and 1 <= len(held) <= 4
    assert {t.metadata["repo"] for t in train} == {"pypi/parse"} and train[len(train) // 2].id in {t.id for t in train}
    pool = SandboxPool(2, "docker", cpus=1.0, mem="1g", workers=2, image=DEFAULT_BASE_IMAGE)
    try:
        task = train[0]
        sb = pool.ready(0, lambda b: fam.reset(b, task), task.image)
        assert pool.images[0] == task.image and pool.counters["image_switches"] == 1
        assert swebench.apply_patch(sb, task.metadata["patch"]).ok and verify(task, sb).reward == 1.0
        again = pool.ready(0, lambda b: fam.reset(b, task), task.image)     # same image: reset, no new box
        assert again is sb and pool.counters["image_switches"] == 1 and verify(task, again).reward == 0.0
        tok = tokenizer_from_config(c)
        pol = ScriptedPolicy({"": [render_final("Done.")]}, tok)
        _, _, infos = rollout_batch(fam, [train[0], held[0]], pol, pool, c, tok)
        assert [i["infra"] for i in infos] == [False, False] and [i["verifier"] for i in infos] == [0.0, 0.0], infos
    finally:
        pool.close()


def _inverse(patch: str) -> str:
    """`patch` undone: its - and + lines swapped (and the counts of its hunk headers)."""
    out = []
    for line in patch.splitlines(True):
        if line.startswith("@@"):
            old, new = line.split(" ")[1:3]
            line = line.replace(f"{old} {new}", f"-{new[1:]} +{old[1:]}", 1)
        elif line[:1] in "+-" and not line.startswith(("+++", "---")):
            line = ("+" if line[0] == "-" else "-") + line[1:]
        out.append(line)
    return "".join(out)


def test_gold_patch_demos(generated):
    """The demo builder (`horizon.env.swe_demos`, configs/swe_real.py's agent) on two instances: the
    gold patch's trajectory is kept (reward 1 in the sandbox) with one edit call per hunk; the
    same instance with its patch reversed (each edit's old text is not in the file) is dropped."""
    from horizon.data.tokenizer import tokenizer_from_config
    from horizon.env.families import family_from_config
    from horizon.env.rollouts import SandboxPool
    from horizon.env.swe_demos import swebench_demos
    from horizon.sandbox import DEFAULT_BASE_IMAGE
    from horizon.utils import cli

    paths, _, _ = generated
    c = cli.parse(["--config=configs/swe_real.py", f"--config.exp.task.train_path={paths['train']}",
                   f"--config.exp.task.heldout_path={paths['heldout']}"], default="configs/swe_real.py")
    fam = family_from_config(c.exp)
    train = list({t.id: t for t in fam.tasks("train", 8)}.values())
    good = max(train, key=lambda t: len(swebench.patch_hunks(t.metadata["patch"])))
    bad = dataclasses.replace(good, id=good.id + "-reversed", prompt=good.prompt + "\n(reversed)",
                              metadata={**good.metadata, "patch": _inverse(good.metadata["patch"])})
    tok = tokenizer_from_config(c)
    pool = SandboxPool(2, "docker", cpus=1.0, mem="1g", workers=2, image=DEFAULT_BASE_IMAGE)
    try:
        rows, report = swebench_demos(fam, [good, bad], pool, c, tok)
    finally:
        pool.close()
    assert (report.kept, report.unsolved, report.infra) == (1, [bad.id], []), report.line()
    text = "".join(tok.decode([int(x) for x in r[0][r[1]]]) for r in rows)      # the trained (assistant) tokens
    n_hunks = len(swebench.patch_hunks(good.metadata["patch"]))
    assert text.count("<function=edit_file>") == n_hunks and text.count("<final>") == 1


@pytest.mark.slow
def test_full_build(docker_ready, tmp_path):
    """The full set from a cold cache: >= 300 instances from >= 8 repositories in < 60 min,
    then an incremental second run (the command documented in docs/PERF.md)."""
    import subprocess
    import sys

    cmd = [sys.executable, "envs/build_repo_images.py", "--config=configs/swegen.py",
           f"--config.build_root={tmp_path}/b", f"--config.out_dir={tmp_path}/out", "--config.force=True",
           *FULL_BUILD_ARGS]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    cold = time.monotonic() - t0
    rep = json.loads((tmp_path / "out/report.json").read_text())
    assert rep["instances"] >= 300 and rep["repositories_with_instances"] >= 8 and cold < 3600, (cold, rep)
    t0 = time.monotonic()
    subprocess.run([c for c in cmd if c != "--config.force=True"], check=True)
    warm = time.monotonic() - t0
    rep2 = json.loads((tmp_path / "out/report.json").read_text())
    assert rep2["validated"] == 0 and rep2["instances"] == rep["instances"], rep2
    print(f"[test_full_build] cold {cold:.0f}s, incremental {warm:.0f}s, {rep['instances']} instances")


FULL_BUILD_ARGS = ("--config.gen.n_candidates=40", "--config.gen.n_features=8", "--config.gen.n_combined=8")
