"""The key-recall family of the self-summarization experiment (horizon.tasks.key_recall, docs/SPEC.md §6).

The scripted demonstrator reads only its context, so these tests pin the mechanism the
experiment measures: the key survives a self-summary or a prompt compaction and is lost under
a sliding window; a lossy summary costs the chain its reward. `sandbox` is the shared fixture
(LocalSandbox, and DockerSandbox on the base image, docker-marked).
"""

import ml_collections
import numpy as np
import pytest

from horizon.agent import run_episodes
from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.demos import KeyRecallDemoPolicy, key_recall_demos
from horizon.env.families import family_from_config, make_episode
from horizon.tasks import key_recall as kr
from horizon.tasks import verify
from horizon.tools.registry import ToolContext, ToolState
from horizon.utils.config import load_config_file

TOK = tokenizer_from_config(load_config_file("configs/selfsum_tiny.py"))   # the study's BPE


@pytest.fixture(scope="module")
def cfg():
    from horizon.utils.config import load_config_file

    return load_config_file("configs/selfsum_tiny.py")


def _agent(cfg, strategy):
    a = ml_collections.ConfigDict(cfg.agent.to_dict())
    a.context_strategy = strategy
    return a


def test_tasks_deterministic_split_and_decoys():
    a, b = kr.make_key_recall_task(5), kr.make_key_recall_task(5)
    assert a == b and kr.key_recall_task_from_id("keyrecall_5") == a
    keys = set()
    for s in range(60):
        t = kr.make_key_recall_task(s)
        md = t.metadata
        keys.add(md["key"])
        assert t.files["key.txt"] == f"key #{md['key']}\n" and t.final_answer == f"#{md['key']}"
        assert md["key"] in kr.KEY_ALPHABET and md["key"] not in md["decoys"] and len(md["decoys"]) == 2
        logs = "".join(t.files[f"{i}.log"] for i in range(1, 5))
        assert all(f"old {d} revoked" in logs for d in md["decoys"]) and f" {md['key']} " not in logs
        assert not {ch for ch in logs if ch.isupper()} - set(md["decoys"])    # no other capital in the logs
    assert len(keys) > 15                      # keys vary over the 23 letters
    assert not set(kr.KEY_ALPHABET) & set(kr.PROMPT_TEMPLATE + kr.SYSTEM_PROMPT + kr.SUMMARY_QUERY +
                                          kr.COMPACTION_QUERY + kr.SUMMARY_HEADER + kr.STATE_TEMPLATE)
    t0 = kr.make_key_recall_task(7, n_decoys=0)
    assert t0.metadata["decoys"] == [] and "revoked" not in "".join(t0.files.values())
    assert not set(kr.key_recall_seeds("train", 50)) & set(kr.key_recall_seeds("heldout", 50))
    assert kr.make_key_recall_task(kr.HELDOUT_SEED_START).split == "heldout"
    with pytest.raises(ValueError):
        kr.make_key_recall_task(1, n_logs=0)
    for bad in ("", "AAB", "Ab", "AB"):                 # empty, repeated, lowercase, no room for 2 decoys
        with pytest.raises(ValueError, match="key_alphabet"):
            kr.make_key_recall_task(1, key_alphabet=bad)


def test_read_tool_and_exact_answer(sandbox):
    t = kr.make_key_recall_task(3)
    fam = family_from_config(load_config_file("configs/selfsum_tiny.py").exp)
    fam.reset(sandbox, t)
    reg = kr.key_recall_registry()
    ctx = ToolContext(sandbox, ToolState())
    assert reg.execute("read", {"path": "key.txt"}, ctx).output == t.files["key.txt"]
    assert reg.execute("read", {"path": "/workspace/2.log"}, ctx).output == t.files["2.log"]
    for bad in ("../etc/passwd", "nope.log", "a b"):
        assert reg.execute("read", {"path": bad}, ctx).error
    key = t.final_answer                                                         # "#Q"
    assert verify(t, sandbox, key, check_edits=False).reward == 1.0
    assert verify(t, sandbox, str(t.metadata["key"]), check_edits=False).reward == 0.0  # the key is "#Q"
    assert verify(t, sandbox, f"The key is {key}", check_edits=False).reward == 0.0   # exact: the key only
    assert verify(t, sandbox, f"{key} #A #B", check_edits=False).reward == 0.0         # listing candidates fails


@pytest.mark.parametrize("strategy,solves", [("self_summary", True), ("prompt_compaction", True),
                                             ("sliding_window", False)])
def test_demonstrator_needs_the_summary(sandbox, cfg, strategy, solves):
    fam = family_from_config(cfg.exp)
    a = _agent(cfg, strategy)
    won = []
    for t in fam.tasks("train", 6):
        fam.reset(sandbox, t)
        tr = run_episodes(KeyRecallDemoPolicy(TOK, 0.0), [make_episode(fam, t, sandbox, TOK, a)], max_steps=30)[0]
        assert tr.end_reason == "final" and tr.stats["tool_calls"] == int(cfg.exp.task.n_logs) + 1   # key + logs
        if strategy != "sliding_window":
            assert tr.stats["summaries"] >= 1 and len(tr.segments) == tr.stats["summaries"] + 1
            assert tr.stats["summary_tokens"] > 0
        won.append(verify(t, sandbox, tr.final_answer, check_edits=False).reward)
    # the window drops the key's observation: only a 1/23 guess can win, never all six
    assert all(won) if solves else sum(won) <= 1


@pytest.mark.parametrize("parallel_prob", [1.0, 0.3])
def test_demonstrator_reads_logs_in_parallel_at_its_rate(sandbox, cfg, parallel_prob):
    """`parallel_prob`: turns read two logs at once (docs/SPEC.md §5 parallel calls); every log is still read
    once, the chain still solves through its summaries, and it takes fewer turns for the same calls."""
    fam = family_from_config(cfg.exp)
    a = _agent(cfg, "self_summary")
    a.max_parallel_calls = 2
    a.max_new_tokens = 96        # two calls in one turn (the config's 48 cut the second one)
    n = int(cfg.exp.task.n_logs)
    parallel = []
    for t in fam.tasks("train", 4):
        fam.reset(sandbox, t)
        pol = KeyRecallDemoPolicy(TOK, 0.0, parallel_prob=parallel_prob)
        tr = run_episodes(pol, [make_episode(fam, t, sandbox, TOK, a)], max_steps=30)[0]
        assert tr.end_reason == "final" and tr.stats["malformed_calls"] == 0
        assert tr.stats["tool_calls"] == n + 1 and tr.stats["summaries"] >= 1
        assert tr.stats["turns"] == tr.stats["tool_calls"] + 1 - tr.stats["parallel_calls"] // 2
        assert verify(t, sandbox, tr.final_answer, check_edits=False).reward == 1.0
        parallel.append(tr.stats["parallel_calls"])
    if parallel_prob == 1.0:      # the first two logs, then pairs while two are left
        assert parallel == [2 * (n // 2)] * 4
    else:
        assert 0 < sum(parallel) < 4 * 2 * (n // 2)


def test_lossy_summaries_cost_the_reward(sandbox, cfg):
    fam = family_from_config(cfg.exp)
    t = fam.make_task(11)
    fam.reset(sandbox, t)
    ep = make_episode(fam, t, sandbox, TOK, _agent(cfg, "self_summary"))
    tr = run_episodes(KeyRecallDemoPolicy(TOK, corrupt_prob=1.0), [ep], max_steps=30)[0]
    assert tr.end_reason == "final" and tr.final_answer != t.final_answer
    assert verify(t, sandbox, tr.final_answer, check_edits=False).reward == 0.0


def test_demo_rows_and_summary_lengths(cfg):
    """Demos go through the real loop: rows are segments with loss on assistant tokens only, and
    the 10-section compaction summaries are several times longer than self-summaries."""
    from horizon.sandbox import open_sandbox

    fam = family_from_config(cfg.exp)
    tasks = fam.tasks("train", 8)
    boxes = [open_sandbox("local") for _ in range(4)]
    try:
        per = {}
        for s in ("self_summary", "prompt_compaction"):
            rows = key_recall_demos(fam, tasks, TOK, _agent(cfg, s), boxes, corrupt_prob=0.0, seed=0,
                                    key_alphabet=kr.KEY_ALPHABET)
            assert all(len(tk) == len(m) and m.any() and not m[0] for tk, m in rows)
            summ = [TOK.decode(tk[m]) for tk, m in rows]
            per[s] = np.mean([len(x[x.index("<summary>"):x.index("</summary>")]) for x in summ if "<summary>" in x])
            assert max(len(tk) for tk, _ in rows) <= cfg.agent.max_context_tokens
        assert per["prompt_compaction"] > 4 * per["self_summary"]
    finally:
        for b in boxes:
            b.close()
