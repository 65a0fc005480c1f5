"""The observation-masking and summarizing-condenser baselines (horizon.agent.summarize, docs/SPEC.md §6).

Unit tests pin the context each strategy builds from a hand-made message list; the episode tests pin
it on a scripted key-recall episode through the real agent loop (LocalSandbox).
"""

import ml_collections
import numpy as np
import pytest

from horizon.agent import Message, ObservationMasking, SummarizingCondenser, make_strategy, run_episodes, split_turns
from horizon.agent.prompt import carry_over, render
from horizon.agent.rollout import validate_agent_config
from horizon.agent.summarize import ContextState
from horizon.data.tokenizer import tokenizer_from_config
from horizon.env.demos import KeyRecallDemoPolicy
from horizon.env.families import family_from_config, make_episode
from horizon.sandbox import open_sandbox
from horizon.studies import selfsum as ss
from horizon.tasks import key_recall as kr
from horizon.tasks import verify
from horizon.utils.config import ConfigError, load_config_file

TOK = tokenizer_from_config(load_config_file("configs/selfsum_tiny.py"))   # the study's BPE


def history():
    """system, task, then three (call, observation) pairs, a summary query and its summary turn."""
    m = [Message("system", "sys", kind="system"), Message("user", "task", kind="task")]
    for i in range(3):
        m += [Message("assistant", f"call{i}"), Message("observation", f"out{i}\nline2")]
    return m


def measure(msgs):      # one "token" per character: easy to check by hand
    return sum(len(x.text) for x in msgs)


def test_masking_replaces_old_outputs_keeps_own_turns():
    msgs = history()
    st = ObservationMasking(trigger_tokens=10, keep_recent=1, placeholder="[{lines} lines omitted]")
    assert not st.should_compact(9) and st.should_compact(10) and st.query() is None
    new = st.compact(ContextState(msgs), None, measure)
    assert [(x.role, x.text) for x in new] == [
        ("system", "sys"), ("user", "task"), ("assistant", "call0"), ("observation", "[2 lines omitted]"),
        ("assistant", "call1"), ("observation", "[2 lines omitted]"), ("assistant", "call2"),
        ("observation", "out2\nline2")]
    assert all(a is b for a, b in zip(new, msgs) if a.role != "observation" or a.text.startswith("out"))
    again = st.compact(ContextState(new), None, measure)      # nothing new to mask: the very same messages
    assert all(a is b for a, b in zip(again, new)) and len(again) == len(new)
    assert ObservationMasking(10, keep_recent=0).compact(ContextState(msgs), None, measure)[-1].kind == "masked"


def test_condenser_keeps_first_summary_and_recent_turns():
    msgs = history() + [Message("user", "Q", kind="summary_query"), Message("assistant", "<summary>s</summary>")]
    # target 0.5 * 60 = 30 characters: head (7) + summary ("S: " + "sum" = 6) + call2/out2 (15) = 28 fits,
    # adding out1 (10) would not; call1 is then the first kept turn only if out1 fits -> the tail is call2, out2
    st = SummarizingCondenser(60, 40, keep_first=0, keep_recent_fraction=0.5, query_text="Q", header="S: ")
    new = st.compact(ContextState(msgs), "sum", measure)
    assert [(x.role, x.text, x.kind) for x in new] == [
        ("system", "sys", "system"), ("user", "task", "task"), ("user", "S: sum", "summary"),
        ("assistant", "call2", ""), ("observation", "out2\nline2", "")]
    first = SummarizingCondenser(60, 40, keep_first=2, keep_recent_fraction=0.5, query_text="Q", header="S: ")
    new = first.compact(ContextState(msgs), "sum", measure)
    assert [x.text for x in new] == ["sys", "task", "call0", "out0\nline2", "S: sum"]  # the first events fill it
    # a second condensation replaces the earlier summary (OpenHands: one summary event, after the head)
    again = st.compact(ContextState(new[:5] + [Message("assistant", "call3"), Message("observation", "o3"),
                                               Message("user", "Q", kind="summary_query"),
                                               Message("assistant", "x")]), "sum2", measure)
    assert [x.text for x in again if x.kind == "summary"] == ["S: sum2"]
    assert [x.text for x in again][-2:] == ["call3", "o3"]
    assert st.query().text == "Q" and st.summary_max_tokens == 40


def agent(strategy, **kw):
    c = ml_collections.ConfigDict(load_config_file("configs/selfsum_tiny.py").agent.to_dict())
    c.context_strategy = strategy
    c.update(kw)
    return c


def test_config_fields_and_validation():
    a = agent("observation_masking")
    assert isinstance(make_strategy(a), ObservationMasking) and make_strategy(a).placeholder == kr.MASK_PLACEHOLDER
    a = agent("summarizing_condenser")
    st = make_strategy(a)
    assert isinstance(st, SummarizingCondenser) and st.query_text == kr.CONDENSER_QUERY
    assert st.summary_max_tokens == a.condenser_max_tokens
    assert st.target == int(a.condenser_keep_recent_fraction * a.trigger_tokens)
    for strategy, bad, field in [("observation_masking", dict(observation_masking_keep_recent=-1), "keep_recent"),
                                 ("observation_masking", dict(observation_placeholder="{x}"), "placeholder"),
                                 ("summarizing_condenser", dict(condenser_keep_recent_fraction=1.0), "fraction"),
                                 ("summarizing_condenser", dict(condenser_keep_first=-1), "keep_first"),
                                 ("summarizing_condenser", dict(condenser_max_tokens=5000), "condenser_max_tokens")]:
        with pytest.raises(ConfigError, match=field):
            validate_agent_config(agent(strategy, **bad))
    validate_agent_config(agent("self_summary", condenser_keep_first=-1))   # checked only where used


@pytest.fixture(scope="module")
def episode():
    """One key-recall task's demonstrator episode under a strategy (LocalSandbox)."""
    c = load_config_file("configs/selfsum_tiny.py")
    fam = family_from_config(c.exp)
    sb = open_sandbox("local")

    def run(strategy, corrupt=0.0):
        t = fam.make_task(3)
        fam.reset(sb, t)
        ep = make_episode(fam, t, sb, TOK, agent(strategy))
        tr = run_episodes(KeyRecallDemoPolicy(TOK, corrupt, notes=strategy == "observation_masking"), [ep])[0]
        return t, ep, tr, verify(t, sb, tr.final_answer, check_edits=False).reward
    yield run
    sb.close()


def test_masking_episode_context(episode):
    t, ep, tr, reward = episode("observation_masking")
    # masking rewrites the context each time it passes the trigger: twice here (the strategy's system note,
    # agent.context_notes, makes the prompt ~15 tokens longer than the once this test first pinned)
    assert reward == 1.0 and tr.end_reason == "final" and tr.stats["summaries"] == 0 and len(tr.segments) == 3
    first, last = (split_turns(s.tokens, TOK) for s in (tr.segments[0], tr.segments[-1]))
    key = t.metadata["key"]
    assert first[0] == ("system", f"{kr.SYSTEM_PROMPT} {kr.CONTEXT_NOTES['observation_masking']}")
    assert ("observation", f"key #{key}\n") in first                    # read before the trigger...
    obs = [x for r, x in last if r == "observation"]
    assert obs[:3] == [kr.MASK_PLACEHOLDER] * 3 and obs[3] == t.files["3.log"]   # ...masked after it, but the last
    own = [x for r, x in last if r == "assistant"]
    assert own[1].startswith(f"<think>key #{key}</think>")            # the model's own note survives masking
    assert [r for r, _ in last[:2]] == ["system", "user"] and last[-1] == ("assistant", f"<final>#{key}</final>")


def test_condenser_episode_context(episode):
    t, ep, tr, reward = episode("summarizing_condenser")
    assert reward == 1.0 and tr.stats["summaries"] == 1 and len(tr.segments) == 2
    first, last = (split_turns(s.tokens, TOK) for s in tr.segments)
    assert first[-2] == ("user", kr.CONDENSER_QUERY)
    key = t.metadata["key"]
    assert last[2] == ("user", f"{kr.SUMMARY_HEADER}context: read key.txt, 3 logs; reply keys\ncompleted: key.txt "
                               f"1.log 2.log 3.log\npending: none\nstate: key #{key}, last 3.log")
    assert [r for r, _ in last[3:]] == ["assistant", "observation", "assistant"]   # the recent turn, verbatim
    assert last[4] == ("observation", t.files["3.log"])
    assert len(tr.segments[1].tokens) - len(split_turns(tr.segments[1].tokens, TOK)[-1][1]) < 400
    _, _, tr, reward = episode("summarizing_condenser", corrupt=1.0)                 # a lossy condensation
    assert reward == 0.0


def test_context_note_joins_the_system_prompt_of_its_strategy_only():
    """`agent.context_notes`: the running strategy's line ends the system prompt (the study's policy
    must know its regime from the first token); other strategies' prompts are unchanged; a key that
    is no strategy is a one-line config error."""
    from horizon.agent.summarize import with_context_note

    c = load_config_file("configs/selfsum_tiny.py")
    cfg = ml_collections.ConfigDict(c.agent.to_dict())
    cfg.context_strategy = "observation_masking"
    assert with_context_note("Tool: read(path).", cfg) == "Tool: read(path). Old tool outputs get omitted."
    cfg.context_notes = ml_collections.ConfigDict({"self_summary": "Context full: you summarize."})
    assert with_context_note("Tool: read(path).", cfg) == "Tool: read(path)."      # no line for masking
    cfg.context_notes = ml_collections.ConfigDict({"self_sumary": "typo"})
    with pytest.raises(ConfigError, match=r"agent\.context_notes\.self_sumary"):
        validate_agent_config(cfg)


def test_carried_turn_renders_identically_but_out_of_the_loss_mask():
    """`prompt.carry_over`: a turn kept across a context rewrite keeps its exact tokens and leaves the
    loss mask, its recorded logprobs, versions and routing (they belong to the context it was sampled in)."""
    ids = np.asarray(TOK.encode("<think>key #Q</think>"), np.int32)
    own = Message("assistant", tokens=ids, logprobs=np.full(len(ids), -0.5, np.float32),
                  policy_versions=np.full(len(ids), 3, np.int32), router_indices=np.zeros((2, len(ids), 1), np.int32))
    msgs = [Message("system", "sys"), Message("user", "task"), own, Message("observation", "out")]
    before, after = render(msgs, TOK), render(carry_over(msgs), TOK)
    np.testing.assert_array_equal(before.tokens, after.tokens)
    assert before.loss_mask.sum() == len(ids) and not after.loss_mask.any()
    assert (after.policy_versions == -1).all() and (after.logprobs == 0).all() and after.router_indices is None
    assert carry_over(msgs)[0] is msgs[0] and not own.carried                     # only generated turns; copies


@pytest.mark.parametrize("strategy", ["observation_masking", "summarizing_condenser", "sliding_window",
                                      "self_summary", "prompt_compaction"])
def test_each_generated_token_is_trained_once_where_it_was_sampled(episode, strategy):
    """Across a rewrite the kept turns are context: the chain's loss masks sum to its generated tokens
    (before `carry_over` a masking chain trained its key note again after the key's observation was
    masked: an unpredictable target), and the only trained key letter of a later segment is the answer's."""
    t, ep, tr, _ = episode(strategy)
    assert len(tr.segments) >= 2
    assert sum(int(s.loss_mask.sum()) for s in tr.segments) == ep.generated_tokens == tr.num_generated_tokens
    last = tr.segments[-1]
    keys = [t.metadata["key"]] if strategy != "sliding_window" else []
    at = ss.key_token_positions(last.tokens, last.loss_mask, keys, TOK)
    assert [ss.memory_kind(TOK.decode(last.tokens[:i])) for i in at] == (["final"] if keys else [])
