"""The long-horizon family of the RL self-summarization study (configs/selfsum_rl.py; horizon.tasks.key_recall
"Long horizons"), its lossy-demo omission rule, the oracle-summary policy and the per-summary carry counts.
Demonstrator chains in the LocalSandbox (no model): what the family asks of a policy, checked on the
committed config."""

import ml_collections
import numpy as np
import pytest

from horizon.agent import run_episodes
from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.demos import KeyRecallDemoPolicy
from horizon.env.families import family_from_config, make_episode
from horizon.sandbox import open_sandbox
from horizon.studies import selfsum as ss
from horizon.studies import selfsum_runs as runs
from horizon.studies.oracle import OracleSummaries
from horizon.tasks import key_recall as kr
from horizon.tasks import verify
from horizon.utils.config import load_config_file

CFG = load_config_file("configs/selfsum_rl.py")
TOK = tokenizer_from_config(CFG)
SEEDS = range(8)


@pytest.fixture(scope="module")
def box():
    sb = open_sandbox("local", None)
    yield sb
    sb.close()


def _chains(policy_of, strategy, box, cfg=CFG, seeds=SEEDS):
    fam = family_from_config(cfg.exp)
    a = ml_collections.ConfigDict(cfg.agent.to_dict())
    a.context_strategy = strategy
    out = []
    for seed in seeds:
        t = fam.make_task(seed)
        fam.reset(box, t)
        ep = make_episode(fam, t, box, TOK, a)
        tr = run_episodes(policy_of(seed), [ep])[0]
        out.append((t, tr, ep, verify(t, box, tr.final_answer, check_edits=False).reward))
    return out


def test_long_relay_tasks():
    t = kr.make_key_recall_task(3, n_logs=12, n_keys=3, n_decoys=0, slot_alphabets=True, n_memos=4, pin_prob=0.5)
    text = "".join(t.files.values())
    assert len(kr.FACT_RE.findall(text)) == 3 + 4 + 1 + t.metadata["pin_needed"]      # keys, memos, pin, reveal
    assert sorted(t.metadata["distractors"]) == sorted(f for f in kr.FACT_RE.findall(text) if f.startswith("memo"))
    pin = t.metadata["pin"]
    assert pin in kr.slot_alphabet(kr.KEY_ALPHABET, 4, 3)
    assert any(f"pin #{pin}" in t.files[f"{i}.log"] for i in (1, 2, 3))
    assert (kr.PIN_NEEDED in t.files["12.log"]) == t.metadata["pin_needed"]
    assert t.final_answer.endswith(f"#{pin}") == t.metadata["pin_needed"]
    needed = [kr.make_key_recall_task(s, n_logs=12, n_keys=3, n_decoys=0, slot_alphabets=True, n_memos=4,
                                      pin_prob=0.5).metadata["pin_needed"] for s in range(40)]
    assert 10 <= sum(needed) <= 30                                    # the reveal is a coin, not a constant
    # the extra lines come from their own stream: without them the task is key_relay's as before
    base = kr.make_key_recall_task(3, n_logs=8, n_keys=3, n_decoys=0, slot_alphabets=True)
    assert base == kr.make_key_recall_task(3, n_logs=8, n_keys=3, n_decoys=0, slot_alphabets=True, n_memos=0)
    with pytest.raises(ValueError, match="slot_alphabets"):
        kr.make_key_recall_task(1, n_logs=12, n_keys=3, n_decoys=0, pin_prob=0.5)
    with pytest.raises(ValueError, match="n_logs"):
        kr.make_key_recall_task(1, n_logs=17, n_keys=3, n_decoys=0, slot_alphabets=True)


@pytest.mark.parametrize("strategy", ["self_summary", "prompt_compaction", "summarizing_condenser"])
def test_perfect_demonstrator_solves_long_horizon(strategy, box):
    """The family's shape (docs/RESULTS.md): >= 12 actions, several rewrites at the committed trigger,
    and self-summary >= 4 summaries per solved episode; the perfect demonstrator solves every task."""
    res = _chains(lambda s: KeyRecallDemoPolicy(TOK), strategy, box)
    for t, tr, _, reward in res:
        assert reward == 1.0 and tr.end_reason == "final", (t.id, tr.end_reason)
        assert tr.stats["tool_calls"] + 1 >= 12 and tr.stats["summaries"] >= 3
        if strategy == "self_summary":
            assert tr.stats["summaries"] >= 4
        assert max(len(s.tokens) for s in tr.segments) <= CFG.agent.max_context_tokens + 1


def test_total_tokens_at_least_four_times_the_trigger(box):
    """Without any rewrite (no strategy, a context large enough) an episode holds >= 4x the trigger."""
    cfg = ml_collections.ConfigDict(CFG.to_dict())
    cfg.agent.update(dict(max_context_tokens=4096, trigger_tokens=4000, context_strategy="self_summary"))
    cfg.model.max_seq_len = 4096
    for _, tr, _, reward in _chains(lambda s: KeyRecallDemoPolicy(TOK), "self_summary", box, cfg, seeds=range(3)):
        assert reward == 1.0 and tr.stats["summaries"] == 0
        assert len(tr.segments[-1].tokens) >= 4 * CFG.agent.trigger_tokens


def test_lossy_rule_omits_and_oracle_restores(box):
    """Lossy demos drop new facts at `keep_prob` (never write a wrong one); the oracle wrapper around the
    lossy demonstrator injects perfect summaries, which restores success; per-summary carry counts."""
    keep = float(CFG.exp.sft.keep_prob)
    lossy = lambda s: KeyRecallDemoPolicy(TOK, 0.0, s, keep_prob=keep, memo_keep_prob=0.5)  # noqa: E731
    seeds = range(16)
    res = _chains(lossy, "self_summary", box, seeds=seeds)
    oracle = _chains(lambda s: OracleSummaries(lossy(s), TOK), "self_summary", box, seeds=seeds)
    carry = {k: 0 for k in ("needed_seen", "needed_kept", "distractors_seen", "distractors_kept")}
    for (t, tr, _, _), (_, _, _, ro) in zip(res, oracle):
        assert ro == 1.0
        for before, summary in ss.summary_pairs(tr.segments, TOK):
            written = kr.FACT_RE.findall(summary)
            assert all(f in before for f in written)              # omission only: every fact written was seen
        c = ss.sm.memory_carry(ss.summary_pairs(tr.segments, TOK), t.metadata["facts"], t.metadata["distractors"])
        for k in carry:
            carry[k] += c[k]
    success = np.mean([r for *_, r in res])
    assert success <= 0.7                                          # the headroom the study needs
    assert carry["needed_kept"] < carry["needed_seen"] and carry["distractors_kept"] < carry["distractors_seen"]
    assert 0.5 < carry["needed_kept"] / carry["needed_seen"] < 1.0


def test_arms_and_ledger_file():
    c = ml_collections.ConfigDict(CFG.to_dict())
    c.exp.triggers = (100,)
    c.exp.seeds = (4, 5)
    a4, a5 = runs.arms(c, 4), runs.arms(c, 5)
    assert [a.name for a in a5] == list(c.exp.strategies)
    assert [a.name for a in a4[3:]] == [f"{s}@100" for s in c.exp.strategies] and a4[3].trigger == 100
    assert runs.with_arm(c, a4[3]).agent.trigger_tokens == 100
    assert runs.ledger_file(c).name == "selfsum_rl.jsonl"
    c.exp.ledger = ""
    assert str(runs.ledger_file(c)).endswith("runs/selfsum_rl/ledger.jsonl")
    c.exp.triggers = (700,)
    with pytest.raises(Exception, match="exp.triggers"):
        ss.validate_study(c)


class _Stream:
    """A stand-in engine stream over the lossy demonstrator: what `run_episodes` drives independently."""

    def __init__(self, policy):
        self.policy, self.queue, self.submitted = policy, [], 0

    def submit(self, episode, context, max_new_tokens):
        self.submitted += 1
        self.queue.append((episode, self.policy([context], max_new_tokens)[0]))

    def advance(self):
        out, self.queue = self.queue, []
        return out

    def release(self, episode):
        pass

    def idle(self, seconds):
        pass

    @property
    def busy(self):
        return bool(self.queue)


class _StreamPolicy:
    def __init__(self, policy):
        self.policy, self.streams = policy, []

    def stream(self):
        self.streams.append(_Stream(self.policy))
        return self.streams[-1]


def test_oracle_wraps_an_engine_stream(box):
    """Through a stream (the engine's schedule) the oracle answers summary turns itself: the inner
    stream sees only action turns, and the lossy policy's episodes are solved."""
    lossy = KeyRecallDemoPolicy(TOK, 0.0, 3, keep_prob=0.0, memo_keep_prob=1.0)     # keeps no new fact
    inner = _StreamPolicy(lossy)
    oracle = OracleSummaries(inner, TOK)
    res = _chains(lambda s: oracle, "self_summary", box, seeds=range(2))
    assert all(r == 1.0 for *_, r in res) and oracle.injected == sum(tr.stats["summaries"] for _, tr, _, _ in res)
    assert sum(s.submitted for s in inner.streams) == sum(tr.stats["turns"] for _, tr, _, _ in res)
    plain = _chains(lambda s: lossy, "self_summary", box, seeds=range(2))
    assert all(r == 0.0 for *_, r in plain)                       # without the oracle every key is lost


def test_rl_study_pipeline_smoke(tmp_path):
    """Everything the RL study's driver does per arm but the model: the SFT-phase eval and the oracle eval
    of one policy (the lossy demonstrator) in a sandbox pool, ledger rows appended, docs/RESULTS.md's
    text rendered from them with the headroom table."""
    from horizon.env.rollouts import SandboxPool
    from horizon.rl.runtime import workers
    from horizon.studies import ledger, results_md

    c = ml_collections.ConfigDict(CFG.to_dict())
    c.exp.update(dict(backend="local", demo_backend="local", pool_size=4, ledger=str(tmp_path / "l.jsonl")))
    c.exp.eval.update(dict(n_tasks=3, passes=2))
    fam = family_from_config(c.exp)
    heldout = fam.tasks("heldout", 3)
    pool = SandboxPool.from_config(c)
    lossy = KeyRecallDemoPolicy(TOK, 0.0, 0, keep_prob=0.3, memo_keep_prob=0.5)
    try:
        arm = runs.arms(c, 0)[0]
        cs = runs.with_arm(c, arm)
        env = workers.family_env(cs, pool=pool)
        fn = lambda p, step: lossy  # noqa: E731
        sft = ss.study_evaluator(env, heldout, cs, TOK, strategy=arm.strategy, policy_fn=fn)(None, 0)
        orc = runs.oracle_eval(None, env, heldout, cs, TOK, strategy=arm.strategy, policy_fn=fn)
    finally:
        pool.close()
    assert orc["heldout_mean"] == 1.0 > sft["heldout_mean"] and orc["oracle_summaries"] >= 4 * 6
    result = dict(start=sft, end=sft, oracle=orc)
    book = runs.ledger_file(c)
    assert runs.record_arm(c, arm, result, book, {"git_commit": "abc"}, command="x", run_wall_s=None) == 18
    assert runs.record_arm(c, arm, result, book, {"git_commit": "abc"}) == 0       # an arm is recorded once
    back = ledger.read_rows(book)
    assert {r["phase"] for r in back} == {"sft", "rl", "oracle"} and all(r["trigger"] == 200 for r in back)
    assert all(r["needed_kept"] <= r["needed_seen"] and r["summaries"] >= 4 for r in back)
    md = results_md.render({"selfsum_rl": back})
    assert "headroom" in md and "self_summary" in md


def test_pin_letters_are_weighted_like_keys(box):
    """Stage 1's key weight covers the pin's letter (a needed fact) as well as the keys."""
    fam = family_from_config(CFG.exp)
    t = next(t for t in fam.tasks("train", 20) if t.metadata["pin_needed"])
    fam.reset(box, t)
    ep = make_episode(fam, t, box, TOK, CFG.agent)
    tr = run_episodes(KeyRecallDemoPolicy(TOK), [ep])[0]
    seg = tr.segments[-1]
    _, w = ss.weight_key_tokens(seg.tokens, seg.loss_mask, TOK, 10.0)
    heavy = [TOK.decode([int(seg.tokens[i])]) for i in np.nonzero(w == 10.0)[0]]
    assert t.metadata["pin"] in heavy and set(t.metadata["keys"]) <= set(heavy)


def test_stage2_trains_only_right_finals_when_asked():
    """`exp.sft.correct_finals_only`: a lossy memory's answer (a key dropped, so answered without it) is
    trained on in stage 2 by default and masked out with the option; every other trained token stays."""
    from horizon.tools.format import FINAL_CLOSE, FINAL_OPEN

    c = ml_collections.ConfigDict(CFG.to_dict())
    c.exp.update(dict(demo_backend="local", demo_sandboxes=2))
    c.exp.sft.final_mask = "turn"                                   # design C: a wrong answer left out whole
    fam = family_from_config(c.exp)
    tasks = fam.tasks("train", 12)
    right = {t.final_answer for t in tasks}

    def trained_answers(only_right: bool):
        rows = ss.demo_rows(fam, c, TOK, ("self_summary",), 0.0, tasks=tasks, keep=ss.keep_rule(c),
                            correct_finals_only=only_right)
        out = []
        for tokens, mask in rows:
            text = TOK.decode([int(t) for t, m in zip(tokens, mask) if m])
            at = text.find(FINAL_OPEN)
            if at >= 0:
                out.append(text[at + len(FINAL_OPEN):text.index(FINAL_CLOSE, at)])
        return out

    every, only = trained_answers(False), trained_answers(True)
    assert len(every) == len(tasks) and set(every) - right           # some lossy answers are wrong demos
    assert only == [a for a in every if a in right]                  # the right ones kept, in order


def test_letter_mask_keeps_the_answer_turn():
    """`exp.sft.final_mask="letters"`: answers slot-aligned (a lost key's slot holds a guess from its own
    slice), every chain keeps its trained answer turn, and only letters that match the task's answer in
    their slot are trained (the guesses are left out unless right by chance)."""
    from horizon.tools.format import FINAL_CLOSE, FINAL_OPEN

    c = ml_collections.ConfigDict(CFG.to_dict())
    c.exp.update(dict(demo_backend="local", demo_sandboxes=2))
    c.exp.sft.final_mask = "letters"
    fam = family_from_config(c.exp)
    tasks = fam.tasks("train", 12)
    rows = ss.demo_rows(fam, c, TOK, ("self_summary",), 0.0, tasks=tasks, keep=ss.keep_rule(c),
                        correct_finals_only=True)
    finals = []
    for tokens, mask in rows:
        text = TOK.decode([int(t) for t in tokens])
        if FINAL_OPEN not in text:
            continue
        at = text.rindex(FINAL_OPEN)
        answer = text[at + len(FINAL_OPEN):text.index(FINAL_CLOSE, at)]
        trained = TOK.decode([int(t) for t, m in zip(tokens, mask) if m])
        finals.append((answer, trained[trained.rindex(FINAL_OPEN) + len(FINAL_OPEN):]))
    assert len(finals) == len(tasks)                               # no answer turn left out
    wrong = 0
    for (answer, trained), t in zip(finals, tasks):
        kept = kr.ANSWER_LETTER_RE.findall(trained.split(FINAL_CLOSE)[0])
        want = t.final_answer.replace("#", "").split()
        assert all(k in want for k in kept)                        # no trained letter is a wrong guess
        wrong += answer != t.final_answer
    assert wrong > 0                                               # lossy chains were there to mask
