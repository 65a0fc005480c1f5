"""Self-summarization chains, baselines, and the recall harness check (docs/SPEC.md §6)."""

import dataclasses

import numpy as np

from horizon.agent import COMPACTION_PROMPT, SUMMARY_QUERY, Episode, RecallScriptedPolicy, run_episodes, split_turns
from horizon.data.tokenizer import ByteTokenizer
from horizon.sandbox.factory import open_sandbox
from horizon.tools import make_registry
from horizon.utils.config import load_config_file

TOK = ByteTokenizer()
FACT = "ZX-4817-Q"
FACT_REGEX = r"deploy code is: ([A-Z0-9-]+)"


@dataclasses.dataclass(frozen=True)
class T:
    id: str
    prompt: str
    files: dict
    solution: tuple = ()
    final_answer: str = ""
    kind: str = "recall"
    metadata: dict = dataclasses.field(default_factory=dict)


def make_recall(n_filler=8, filler_bytes=900, seed=0):
    """A small recall task: the fact is in the first file read, fillers push it past the trigger."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    filler = {f"data/f{i}.txt": "\n".join(" ".join(rng.choice(words, 8)) for _ in range(filler_bytes // 50))
              for i in range(n_filler)}
    files = {"notes/README.md": f"Release notes.\nThe deploy code is: {FACT}\nKeep it safe.\n", **filler}
    sol = ({"name": "read_file", "args": {"path": "/workspace/notes/README.md"}},
           *({"name": "read_file", "args": {"path": f"/workspace/{p}"}} for p in filler),
           {"name": "edit_file", "args": {"command": "create", "path": "/workspace/ANSWER", "file_text": FACT}})
    return T("demo_recall", "Read the notes in /workspace/notes, then review every file under /workspace/data. "
             "Finally write the deploy code from the notes to /workspace/ANSWER and tell me what it is.",
             files, sol, FACT, metadata={"fact_regex": FACT_REGEX})


def theirs():
    from horizon.tasks import make_recall_task

    return make_recall_task(0, n_filler_files=6, filler_bytes=1500)


def run(task, strategy, **kw):
    c = load_config_file("configs/agent_tiny.py").agent
    c.context_strategy = strategy
    c.include_file_listing = False
    c.max_context_tokens = 20000
    c.summary_max_tokens = 600
    for k, v in kw.items():
        c[k] = v
    sb = open_sandbox("local")
    for p, text in task.files.items():
        sb.write_file(f"/workspace/{p}", text)
    try:
        base = len(Episode(task, sb, make_registry(), TOK, c).context_tokens())
        c.trigger_tokens = base + 3000     # a few filler reads past the start
        ep = Episode(task, sb, make_registry(), TOK, c)
        (traj,) = run_episodes(RecallScriptedPolicy.from_tasks([task], TOK), [ep], max_steps=60)
        if task.id.startswith("recall_"):   # horizon.tasks recall task: the real verifier decides
            from horizon.tasks import verify

            answer = verify(task, sb, traj.final_answer).reward
        else:
            answer = sb.read_file("/workspace/ANSWER").decode() if sb.exec("test -f /workspace/ANSWER").ok else None
    finally:
        sb.close()
    return traj, answer, c.trigger_tokens


def test_recall_policy_succeeds_with_self_summary_and_chain_layout():
    task = make_recall()
    traj, answer, trigger = run(task, "self_summary")
    assert traj.end_reason == "final" and traj.final_answer == FACT and answer == FACT
    assert traj.stats["summaries"] >= 1 and len(traj.segments) == traj.stats["summaries"] + 1
    for i, seg in enumerate(traj.segments):
        turns = split_turns(seg.tokens, TOK)
        if i < len(traj.segments) - 1:   # closed by a summary: query as the last user turn, then the summary
            assert turns[-2] == ("user", SUMMARY_QUERY) and "<summary>" in turns[-1][1]
            assert seg.loss_mask[-1] and seg.tokens[-1] == TOK.END_TURN   # summary tokens are trained on
            assert len(seg.tokens) < trigger + 8192 + 1200
        if i > 0:    # restarted as [system, task, summary, state]
            roles = [r for r, _ in turns[:4]]
            assert roles == ["system", "user", "user", "user"]
            assert turns[1][1] == task.prompt
            assert turns[2][1].startswith("Summary of the work so far") and FACT in turns[2][1]
            assert turns[3][1].startswith("Conversation state:") and f"summaries so far: {i}" in turns[3][1]
            assert not seg.loss_mask[:len(TOK.encode(turns[0][1])) + 10].any()
    assert sum(int(s.loss_mask.sum()) for s in traj.segments) == traj.num_generated_tokens > 0
    # every step was done once: the chain did not lose its place
    assert traj.stats["tool_calls"] == len(task.solution) and traj.stats["malformed_calls"] == 0


def test_tasks_recall_task_succeeds_with_self_summary_fails_with_sliding_window():
    task = theirs()
    code = task.metadata["code"]
    traj, reward, _ = run(task, "self_summary")
    assert traj.end_reason == "final" and traj.stats["summaries"] >= 1 and reward == 1.0, traj.final_answer
    assert code in traj.final_answer and task.metadata["corrupt_file"] in traj.final_answer
    traj, reward, _ = run(task, "sliding_window")
    assert traj.end_reason == "final" and len(traj.segments) >= 2 and reward == 0.0
    assert code not in traj.final_answer   # the early fact fell out of the window
    traj, reward, _ = run(task, "none", max_context_tokens=60000)
    assert reward == 1.0 and len(traj.segments) == 1


def test_recall_policy_fails_with_sliding_window():
    task = make_recall()
    traj, answer, trigger = run(task, "sliding_window")
    assert traj.end_reason == "final" and traj.stats["summaries"] == 0
    assert traj.final_answer == "UNKNOWN" and answer == "UNKNOWN"
    assert len(traj.segments) >= 2
    first, last = (split_turns(s.tokens, TOK) for s in (traj.segments[0], traj.segments[-1]))
    assert any(FACT in t for r, t in first if r == "observation")
    assert not any(FACT in t for _, t in last)
    assert [r for r, _ in last[:2]] == ["system", "user"]   # system + task kept
    assert all(len(s.tokens) < trigger + 8192 for s in traj.segments)


def test_recall_policy_succeeds_without_compaction_when_context_fits():
    traj, answer, _ = run(make_recall(), "none", max_context_tokens=60000)
    assert traj.final_answer == FACT and answer == FACT and len(traj.segments) == 1


def test_prompt_compaction_baseline_chains_with_long_prompt():
    traj, answer, _ = run(make_recall(), "prompt_compaction", compaction_max_tokens=900)
    assert traj.final_answer == FACT and traj.stats["summaries"] >= 1
    turns = split_turns(traj.segments[0].tokens, TOK)
    assert turns[-2] == ("user", COMPACTION_PROMPT) and COMPACTION_PROMPT.count("\n") >= 10
    assert len(COMPACTION_PROMPT) > 4 * len(SUMMARY_QUERY)


def test_summary_generation_limit_is_the_strategy_limit():
    task = make_recall()
    c = load_config_file("configs/agent_tiny.py").agent
    c.summary_max_tokens = 321
    sb = open_sandbox("local")
    try:
        ep = Episode(task, sb, make_registry(), TOK, c)
        assert ep.max_new_tokens() == c.max_new_tokens
        ep.messages.append(ep.strategy.query())
        ep.phase = "summarize"
        assert ep.max_new_tokens() == 321
    finally:
        sb.close()


def test_strategy_texts_are_configurable_and_no_back_to_back_compaction():
    """Short env-specific texts replace the defaults; a summary that leaves the context above the
    trigger is not re-summarized before a new turn (no compaction loop: docs/SPEC.md §6 step 4 -> step 1)."""
    from horizon.agent import Generation

    task = make_recall()
    c = load_config_file("configs/agent_tiny.py").agent
    c.update(dict(context_strategy="self_summary", include_file_listing=False, summary_query="Sum up.",
                  summary_header="S: ", state_template="State {summaries}/{turns}.", max_context_tokens=20000))
    sb = open_sandbox("local")
    for p, text in task.files.items():
        sb.write_file(f"/workspace/{p}", text)
    try:
        ep = Episode(task, sb, make_registry(), TOK, c)
        c.trigger_tokens = len(ep.context_tokens()) + 10
        ep = Episode(task, sb, make_registry(), TOK, c)

        def gen(text):
            ids = np.asarray(TOK.encode(text) + [TOK.END_TURN], np.int32)
            return Generation(ids, np.zeros(len(ids), np.float32))

        ep.step(gen('<function=read_file>\n<parameter=path>/workspace/notes/README.md</parameter>\n</function>'))
        assert ep.phase == "summarize" and split_turns(ep.context_tokens(), TOK)[-2] == ("user", "Sum up.")
        ep.step(gen("<summary>" + "x" * 200 + "</summary>"))     # too long: the new context is above the trigger
        turns = split_turns(ep.context_tokens(), TOK)
        assert turns[2] == ("user", "S: " + "x" * 200) and turns[3] == ("user", "State 1/1.")
        assert len(ep.context_tokens()) >= c.trigger_tokens and ep.phase == "act"   # no immediate second query
        ep.step(gen('<function=list_dir>\n<parameter=path>/workspace</parameter>\n</function>'))
        assert ep.phase == "summarize" and ep.stats["summaries"] == 1               # after a new turn: again
    finally:
        sb.close()
