"""Synthetic long-horizon recall tasks: determinism, sizing against a trigger, verification (docs/SPEC.md §5, §6)."""

import pytest

from horizon.sandbox.base import TRUNCATION_MARKER
from horizon.tasks import (
    HELDOUT_SEED_START,
    filler_volume,
    get_task,
    make_recall_task,
    make_recall_task_for_trigger,
    open_task_sandbox,
    recall_seeds,
    verify,
)

TRIGGER = 6000   # tokens; byte tokenizer => bytes


def test_deterministic_per_seed():
    a, b = make_recall_task(11), make_recall_task(11)
    assert a == b
    others = [make_recall_task(s) for s in range(12, 20)]
    assert len({t.metadata["code"] for t in others + [a]}) == len(others) + 1
    assert a.metadata["code"] not in a.metadata["decoys"]
    assert all(any(d in text for text in a.files.values()) for d in a.metadata["decoys"])
    assert sum(a.metadata["code"] in text for text in a.files.values()) == 1   # only notes/KEY.txt
    assert get_task(a.id) == a
    custom = make_recall_task(3, n_filler_files=5, filler_bytes=512, n_decoys=1, key_in_prompt=True)
    assert custom.id == "recall_3_n5_b512_d1_k" and get_task(custom.id) == custom
    assert custom.metadata["code"] in custom.prompt
    assert all(custom.metadata["code"] not in text for text in custom.files.values())


def test_splits_by_seed_range():
    assert make_recall_task(HELDOUT_SEED_START - 1).split == "train"
    assert make_recall_task(HELDOUT_SEED_START).split == "heldout"
    assert recall_seeds("heldout", 3) == [HELDOUT_SEED_START, HELDOUT_SEED_START + 1, HELDOUT_SEED_START + 2]
    assert recall_seeds("train", 2, start=5) == [5, 6]
    with pytest.raises(ValueError):
        recall_seeds("train", 2, start=HELDOUT_SEED_START - 1)


def test_bad_arguments():
    with pytest.raises(ValueError):
        make_recall_task(-1)
    with pytest.raises(ValueError):
        make_recall_task(0, n_filler_files=2, n_decoys=3)
    with pytest.raises(ValueError):
        make_recall_task_for_trigger(0, trigger_tokens=0)


def test_filler_exceeds_trigger_and_solution_recalls(solve):
    task = make_recall_task_for_trigger(7, TRIGGER, margin=2.0)
    assert filler_volume(task) >= 2 * TRIGGER
    with open_task_sandbox(task, backend="local") as sb:
        assert verify(task, sb).reward == 0.0
        outs = solve(task, sb)
        code = task.metadata["code"]
        # the key fact is in the FIRST tool output and in no later one (only memory can carry it)
        assert code in outs[0] and not any(code in o for o in outs[1:-1])
        shard_outs = outs[2:-1]
        assert len(shard_outs) == len(task.metadata["filler_files"])
        assert sum(len(o.encode()) for o in shard_outs) > TRIGGER
        marker = TRUNCATION_MARKER.split("{")[0]
        assert not any(marker in o for o in shard_outs), "tool observation cap truncated a shard"
        assert sum("STATUS: CORRUPT" in o for o in shard_outs) == 1
        assert verify(task, sb, final_answer="").reward == 1.0          # ANSWER.txt suffices
        sb.write_file("/workspace/ANSWER.txt", f"{task.metadata['decoys'][0]}\n{task.metadata['corrupt_file']}\n")
        assert verify(task, sb).reward == 0.0                           # a revoked decoy code fails
        assert verify(task, sb, final_answer=task.final_answer).reward == 1.0
        wrong = [f for f in task.metadata["filler_files"] if f != task.metadata["corrupt_file"]][0]
        sb.write_file("/workspace/ANSWER.txt", "")
        assert verify(task, sb, final_answer=f"{code} {wrong}").reward == 0.0
