"""The harder family, key_relay (horizon.tasks.key_recall with n_keys > 1, docs/SPEC.md §6): keys
arrive at different times, an episode needs >= 2 summaries before the answer, and a later summary
must carry forward what an earlier one held. `sandbox` is the shared fixture (LocalSandbox, and
DockerSandbox on the base image, docker-marked: the episode end to end in a real container)."""

import ml_collections
import pytest

from horizon.agent import run_episodes, split_turns
from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.demos import KeyRecallDemoPolicy
from horizon.env.families import family_from_config, make_episode
from horizon.tasks import key_recall as kr
from horizon.tasks import verify
from horizon.utils.config import load_config_file

TOK = tokenizer_from_config(load_config_file("configs/selfsum_relay.py"))   # the study's BPE


@pytest.fixture(scope="module")
def cfg():
    return load_config_file("configs/selfsum_relay.py")


def _run(cfg, sandbox, strategy, seed=5, corrupt=0.0):
    fam = family_from_config(cfg.exp)
    a = ml_collections.ConfigDict(cfg.agent.to_dict())
    a.context_strategy = strategy
    t = fam.make_task(seed)
    fam.reset(sandbox, t)
    tr = run_episodes(KeyRecallDemoPolicy(TOK, corrupt, notes=strategy == "observation_masking"),
                      [make_episode(fam, t, sandbox, TOK, a)])[0]
    return t, tr, verify(t, sandbox, tr.final_answer, check_edits=False).reward


def test_relay_tasks():
    assert kr.late_key_logs(8, 3) == [4, 8] and kr.late_key_logs(2, 2) == [2] and kr.late_key_logs(4, 1) == []
    t = kr.make_key_recall_task(5, n_logs=8, n_keys=3, n_decoys=0)
    keys = t.metadata["keys"]
    assert len(set(keys)) == 3 and t.final_answer == " ".join(f"#{k}" for k in keys)
    assert t.files["key.txt"] == f"key #{keys[0]}\n" and f"key #{keys[1]}" in t.files["4.log"]
    assert f"key #{keys[2]}" in t.files["8.log"] and t.metadata["facts"] == [f"key #{k}" for k in keys]
    assert t.id == "keyrelay3_5" and t == kr.make_key_recall_task(5, n_logs=8, n_keys=3, n_decoys=0)
    assert not set(kr.KEY_ALPHABET) & set(kr.RELAY_PROMPT_TEMPLATE + kr.CONDENSER_QUERY + kr.MASK_PLACEHOLDER)
    # key_recall as before
    assert kr.make_key_recall_task(5, n_decoys=0) == kr.make_key_recall_task(5, n_decoys=0, n_keys=1)
    with pytest.raises(ValueError, match="n_keys"):
        kr.make_key_recall_task(1, n_logs=2, n_keys=4)
    # slot_alphabets: key i from the i-th disjoint slice (23 letters: 8, 8, 7), the files laid out as before
    assert [kr.slot_alphabet("ABCDEFG", 3, i) for i in range(3)] == ["ABC", "DE", "FG"]
    seen = set()
    for seed in range(40):
        t = kr.make_key_recall_task(seed, n_logs=8, n_keys=3, n_decoys=0, slot_alphabets=True)
        ks = t.metadata["keys"]
        assert all(k in kr.slot_alphabet(kr.KEY_ALPHABET, 3, i) for i, k in enumerate(ks)), ks
        assert t.files["key.txt"] == f"key #{ks[0]}\n" and f"key #{ks[1]}" in t.files["4.log"]
        seen.add(ks[0])
    assert len(seen) >= 6                               # every letter of slot 0's 8 is drawn, not a fixed one
    with pytest.raises(ValueError, match="slot_alphabets"):
        kr.make_key_recall_task(1, n_keys=1, n_decoys=0, slot_alphabets=True)
    bad = ml_collections.ConfigDict(load_config_file("configs/selfsum_relay.py").exp.to_dict())
    bad.task.n_keys = 1
    with pytest.raises(ValueError, match="n_keys"):
        family_from_config(bad)


def test_self_summary_relay_needs_two_summaries_that_carry_the_keys(cfg, sandbox):
    """End to end (both sandbox backends): >= 2 summaries before the answer, the second holds the
    first key (carried forward: its observation left the context with the first summary), success."""
    for seed in range(3):
        t, tr, reward = _run(cfg, sandbox, "self_summary", seed)
        keys = t.metadata["keys"]
        assert reward == 1.0 and tr.end_reason == "final" and tr.stats["summaries"] >= 2
        summaries = [x for s in tr.segments[1:] for r, x in split_turns(s.tokens, TOK)
                     if x.startswith(kr.SUMMARY_HEADER)]
        assert len(summaries) >= 2 and f"key #{keys[0]}" in summaries[0]
        assert f"key #{keys[0]}" in summaries[1] and f"key #{keys[1]}" in summaries[1]
        assert not any(x == f"key #{keys[0]}\n" for r, x in split_turns(tr.segments[1].tokens, TOK)
                       if r == "observation")


@pytest.mark.parametrize("strategy,solves", [("prompt_compaction", True), ("summarizing_condenser", True),
                                             ("observation_masking", False), ("sliding_window", False)])
def test_relay_other_strategies(cfg, strategy, solves):
    from horizon.sandbox import open_sandbox

    sb = open_sandbox("local")
    try:
        t, tr, reward = _run(cfg, sb, strategy)
    finally:
        sb.close()
    assert reward == float(solves)
    if strategy == "observation_masking":      # why configs/selfsum_relay.py leaves it out of the study
        assert tr.end_reason == "context_full" and "observation_masking" not in cfg.exp.strategies
    if strategy in ("prompt_compaction", "summarizing_condenser"):
        assert tr.stats["summaries"] >= 2
    assert tr.stats["thinking_tokens"] + tr.stats["tool_call_tokens"] + tr.stats["final_tokens"] \
        <= cfg.agent.max_total_tokens


def test_lossy_relay_summary_costs_the_reward(cfg):
    from horizon.sandbox import open_sandbox

    sb = open_sandbox("local")
    try:
        _, tr, reward = _run(cfg, sb, "self_summary", corrupt=1.0)
    finally:
        sb.close()
    assert tr.end_reason == "final" and reward == 0.0
