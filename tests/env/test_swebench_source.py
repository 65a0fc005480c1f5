"""A SWE-bench task set as a task source without Docker: the RL family's splits and
seeds, the eval config's checks and the per-repository table."""

import json

import ml_collections
import pytest

from horizon.env.families import HELDOUT_SEED_BASE, family_from_config
from horizon.eval.report import repo_rows
from horizon.utils import cli
from horizon.utils.config import ConfigError


def _write(path, repo, n):
    rows = [{"instance_id": f"{repo}__x-{i}", "repo": f"pypi/{repo}", "base_commit": "abc",
             "patch": "diff --git a/m.py b/m.py\n", "test_patch": "", "problem_statement": f"fix {repo} {i}",
             "FAIL_TO_PASS": json.dumps(["t.py::a"]),
             "PASS_TO_PASS": json.dumps(["t.py::b"]), "image": f"horizon-swegen:{repo}-{i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_family_splits_and_seeds(tmp_path):
    e = ml_collections.ConfigDict(dict(env="swebench", task=dict(
        train_path=str(_write(tmp_path / "train.jsonl", "parse", 3)),
        heldout_path=str(_write(tmp_path / "heldout.jsonl", "six", 2)))))
    fam = family_from_config(e)
    train = fam.tasks("train", 7, start=1)
    assert [t.metadata["instance_id"] for t in train] == [f"parse__x-{i % 3}" for i in range(1, 8)]   # epochs
    held = fam.tasks("heldout", 10)
    assert [t.metadata["repo"] for t in held] == ["pypi/six"] * 2 and fam.seeds("heldout", 10)[0] == HELDOUT_SEED_BASE
    assert fam.image_of(held[1]) == "horizon-swegen:six-1" and fam.system_prompt == ""
    assert "edit_file" in fam.registry(True).names


def test_eval_config_checks(tmp_path):
    from horizon.eval.setup import validate_eval_config

    bad = cli.parse(["--config=configs/eval_swegen.py", f"--config.eval.task_path={tmp_path}/nope.jsonl"],
                    default="configs/eval_swegen.py")
    with pytest.raises(ConfigError, match="eval.task_path"):
        validate_eval_config(bad)
    path = _write(tmp_path / "h.jsonl", "six", 2)
    c = cli.parse(["--config=configs/eval_swegen.py", f"--config.eval.task_path={path}",
                   "--config.eval.checkpoints=('gold=@gold','x=@bogus')"], default="configs/eval_swegen.py")
    with pytest.raises(ConfigError, match="patch policies"):
        validate_eval_config(c)


def test_repo_rows():
    per_task = [dict(policy="gold", task_id=t, kind="bugfix", accuracy=a, best_of_1=a)
                for t, a in (("a1", 1.0), ("a2", 0.0), ("b1", 1.0))]
    rows = repo_rows(per_task, {"a1": "pypi/a", "a2": "pypi/a", "b1": "pypi/b"})
    assert {(r["repo"], r["tasks"], r["accuracy"]) for r in rows} == {("pypi/a", 2, 0.5), ("pypi/b", 1, 1.0)}
