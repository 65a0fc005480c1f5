"""Context strategies: self-summarization and its baselines (docs/SPEC.md §6).

Every strategy has the same interface: `should_compact(n_context_tokens)`, an optional
model `query()` (a user message asking for a summary), and `compact(state, summary)`
which takes the episode's message state and returns the new message list. The agent
loop starts a new segment after every compaction (the context was rewritten, so the
old one cannot be extended), which makes a rollout a chain of segments.

- `self_summary` (the method): a SHORT query; the model answers with
  `<think>scratch</think><summary>...</summary>` (see `horizon.tools.format`) within
  `summary_max_tokens`; the new context is [system, task, summary, state block].
- `prompt_compaction` (baseline): the same chaining, but a long structured prompt with
  ten sections and a larger `compaction_max_tokens` limit.
- `sliding_window` (baseline): no model call; drop the oldest turns (system and task
  kept) until the context is below `sliding_window_keep_fraction * trigger_tokens`.
- `observation_masking` (baseline): no model call; old tool outputs become a short placeholder,
  the model's own turns, system prompt and task stay (`ObservationMasking`).
- `summarizing_condenser` (baseline): OpenHands' LLM summarizing condenser: keep the first
  events, summarize the middle with the model, keep the recent part verbatim (`SummarizingCondenser`).
- `none`: never compacts (the episode ends with "context_full" at the hard limit).

`STRATEGIES` names them all (the agent config's `context_strategy`); `validate_strategy_options`
checks the fields of the ones a run uses; `make_strategy` builds one from the agent config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from horizon.agent.prompt import Message
from horizon.utils.config import need, need_float, need_int

STRATEGIES = ("self_summary", "prompt_compaction", "sliding_window", "observation_masking", "summarizing_condenser",
              "none")
SUMMARIZING = ("self_summary", "prompt_compaction", "summarizing_condenser")   # strategies that ask the model

SUMMARY_QUERY = ("Please summarize the conversation so far, keeping everything you need to finish the task "
                 "(key facts, file paths, what is done, what is left). Think first in <think>...</think>, "
                 "then write the summary in <summary>...</summary>.")

COMPACTION_SECTIONS = (
    "Primary request and intent: every explicit request of the user, in detail.",
    "Key technical concepts: technologies, frameworks and conventions involved.",
    "Files and code sections: every file examined, modified or created, with why it matters and the "
    "important snippets verbatim.",
    "Errors and fixes: every error met, how it was fixed, and user feedback on it.",
    "Problem solving: problems solved and ongoing troubleshooting.",
    "Key facts and values: every identifier, number, name, path or other value that may be needed later, "
    "copied exactly.",
    "All user messages: list every non-tool-result user message.",
    "Pending tasks: tasks explicitly asked for that are not done.",
    "Current work: precisely what was being worked on immediately before this summary.",
    "Next step: the single next step, in line with the most recent request, quoting the latest work verbatim.",
)

COMPACTION_PROMPT = (
    "Your task is to create a detailed summary of the conversation so far, paying close attention to the "
    "user's explicit requests and your previous actions. The summary must capture technical details, code "
    "patterns and decisions essential for continuing the work without losing context. Before writing it, "
    "analyse the conversation chronologically inside <think>...</think>, checking each section for "
    "completeness and accuracy. Then write the summary inside <summary>...</summary> with these sections:\n"
    + "\n".join(f"{i}. {s}" for i, s in enumerate(COMPACTION_SECTIONS, 1))
    + "\nBe thorough: missing information cannot be recovered after this point."
)

SUMMARY_HEADER = "Summary of the work so far (you wrote it before the context was reset):\n"


@dataclasses.dataclass
class ContextState:
    """The episode's message state that a strategy rewrites."""

    messages: list[Message]
    num_summaries: int = 0             # summaries already made (before this one)
    turns: int = 0
    max_turns: int = 0
    remaining_todos: list[str] = dataclasses.field(default_factory=list)


def head_messages(messages: list[Message]) -> list[Message]:
    """The messages every new context keeps: system prompt and task."""
    return [m for m in messages if m.kind in ("system", "task")]


STATE_TEMPLATE = ("Conversation state:\n- summaries so far: {summaries}\n- turns used: {turns} of {max_turns}\n"
                  "- plan / remaining todos:\n{todos}\nContinue the task from here.")


def state_block(state: ContextState, summaries_after: int, template: str = STATE_TEMPLATE) -> str:
    """The conversation-state message after a compaction (docs/SPEC.md §6 step 4); `template` fields:
    {summaries}, {turns}, {max_turns}, {todos}."""
    todos = "\n".join(f"  - {t}" for t in state.remaining_todos) or "  (none recorded)"
    return template.format(summaries=summaries_after, turns=state.turns, max_turns=state.max_turns, todos=todos)


class ContextStrategy:
    """Base: never compacts."""

    name = "none"
    summary_max_tokens = 0

    def __init__(self, trigger_tokens: int):
        if trigger_tokens <= 0:
            raise ValueError(f"trigger_tokens must be positive, got {trigger_tokens}")
        self.trigger_tokens = int(trigger_tokens)

    def should_compact(self, n_context_tokens: int) -> bool:
        return False

    def query(self) -> Message | None:
        """The user message asking the model to summarize, or None (no model call)."""
        return None

    def compact(self, state: ContextState, summary: str | None,
                measure: Callable[[list[Message]], int]) -> list[Message]:
        return list(state.messages)


class SelfSummary(ContextStrategy):
    name = "self_summary"
    default_query = SUMMARY_QUERY

    def __init__(self, trigger_tokens: int, summary_max_tokens: int, *, query_text: str | None = None,
                 header: str = SUMMARY_HEADER, state_template: str = STATE_TEMPLATE):
        super().__init__(trigger_tokens)
        if summary_max_tokens <= 0:
            raise ValueError(f"summary_max_tokens must be positive, got {summary_max_tokens}")
        self.summary_max_tokens = int(summary_max_tokens)
        self.query_text = query_text or self.default_query
        self.header, self.state_template = header, state_template

    def should_compact(self, n_context_tokens: int) -> bool:
        return n_context_tokens >= self.trigger_tokens

    def query(self) -> Message:
        return Message("user", self.query_text, kind="summary_query")

    def compact(self, state, summary, measure):
        return head_messages(state.messages) + [
            Message("user", self.header + (summary or "(empty summary)"), kind="summary"),
            Message("user", state_block(state, state.num_summaries + 1, self.state_template), kind="state"),
        ]


class PromptCompaction(SelfSummary):
    name = "prompt_compaction"
    default_query = COMPACTION_PROMPT


class SlidingWindow(ContextStrategy):
    name = "sliding_window"

    def __init__(self, trigger_tokens: int, keep_fraction: float):
        super().__init__(trigger_tokens)
        if not 0.0 < keep_fraction <= 1.0:
            raise ValueError(f"sliding_window_keep_fraction must be in (0, 1], got {keep_fraction}")
        self.target = int(keep_fraction * trigger_tokens)

    def should_compact(self, n_context_tokens: int) -> bool:
        return n_context_tokens >= self.trigger_tokens

    def compact(self, state, summary, measure):
        head = head_messages(state.messages)
        tail = [m for m in state.messages if m.kind not in ("system", "task")]
        min_keep = 2   # the last call and its observation stay, whatever their size
        while len(tail) > min_keep and measure(head + tail) >= self.target:
            tail.pop(0)
        while len(tail) > min_keep and tail[0].role == "observation":  # no orphan observations
            tail.pop(0)
        return head + tail


MASK_PLACEHOLDER = "[old tool output omitted: {lines} lines]"

CONDENSER_PROMPT = (
    "You are maintaining a context-aware state summary for an interactive agent. The older part of the "
    "conversation (everything before the most recent steps, including any previous summary) will be replaced by "
    "your summary; the most recent steps stay. Track, in <summary>...</summary> after thinking in "
    "<think>...</think>:\n"
    "USER_CONTEXT: essential user requirements, goals and clarifications.\n"
    "COMPLETED: tasks completed so far, with brief results.\n"
    "PENDING: tasks that still need to be done.\n"
    "CURRENT_STATE: current variables, data structures and relevant state, values copied exactly.\n"
    "CODE_STATE: file paths, function signatures, data structures.\n"
    "TESTS: failing cases, error messages, outputs.\n"
    "Keep every value that may be needed later; drop what is done and irrelevant."
)


class ObservationMasking(ContextStrategy):
    """Observation masking (baseline, no model call): when the context reaches the trigger, every
    tool output except the `keep_recent` most recent is replaced by a short `placeholder`
    ({lines}: the lines it held); the system prompt, the task and all of the model's own turns
    (calls, thinking, notes) stay verbatim. Models Lindenbauer et al. 2025, "The Complexity Trap:
    Simple Observation Masking Is as Efficient as LLM Summarization for Agent Context Management"
    (a strong, cheap baseline that often matches LLM summarization), itself SWE-agent's elision of
    old observations (Yang et al. 2024, "Old environment output: (n lines omitted)"). The paper
    masks on every turn, keeping a rolling window of M observations; here masking runs at the
    trigger like every other strategy (docs/SPEC.md §6 step 1), so the context — and an engine's KV cache —
    is rewritten only when it must be. An already masked output is kept as is (same object): a
    trigger that finds nothing new to mask changes nothing, and the episode runs into the hard
    context limit instead, the honest cost of the baseline."""

    name = "observation_masking"

    def __init__(self, trigger_tokens: int, keep_recent: int, placeholder: str = MASK_PLACEHOLDER):
        super().__init__(trigger_tokens)
        if keep_recent < 0:
            raise ValueError(f"observation_masking_keep_recent must be >= 0, got {keep_recent}")
        self.keep_recent, self.placeholder = int(keep_recent), placeholder

    def should_compact(self, n_context_tokens: int) -> bool:
        return n_context_tokens >= self.trigger_tokens

    def mask(self, m: Message) -> Message:
        return Message("observation", self.placeholder.format(lines=len(m.text.splitlines())), kind="masked")

    def compact(self, state, summary, measure):
        obs = [i for i, m in enumerate(state.messages) if m.role == "observation"]
        old = set(obs[:max(0, len(obs) - self.keep_recent)])
        return [self.mask(m) if i in old and m.kind != "masked" else m for i, m in enumerate(state.messages)]


class SummarizingCondenser(SelfSummary):
    """An OpenHands-style summarizing condenser (baseline): at the trigger the model is asked (the
    long `CONDENSER_PROMPT`, or `condenser_prompt`) to summarize the older part of the context; the
    new context is [system, task, the first `keep_first` events after them, the summary, the most
    recent events] — the recent ones verbatim, as many whole turns as keep the new context within
    `keep_recent_fraction * trigger_tokens` (no orphan observation first; none if the rest fills it).
    Models OpenHands' `LLMSummarizingCondenser` (openhands/memory/condenser/impl/llm_summarizing_condenser.py; SDK
    openhands/sdk/context/condenser/llm_summarizing_condenser.py): keep the first `keep_first` events,
    replace the forgotten middle (and the previous summary) by one LLM summary event placed after
    them, keep the most recent events so that the condensed view holds `max_size // 2` events in
    total (head and summary included). Two differences, both to compare like
    with like: the summary is asked for in the same context (a user turn at the end, as for
    self-summary and prompt compaction: the summary tokens are trained with the chain's reward, SPEC
    §6, and an engine reuses the KV cache), where OpenHands calls the LLM separately on the
    forgotten events only; and sizes are in tokens against the shared trigger, not event counts."""

    name = "summarizing_condenser"
    default_query = CONDENSER_PROMPT

    def __init__(self, trigger_tokens: int, summary_max_tokens: int, *, keep_first: int, keep_recent_fraction: float,
                 query_text: str | None = None, header: str = SUMMARY_HEADER):
        super().__init__(trigger_tokens, summary_max_tokens, query_text=query_text, header=header)
        if keep_first < 0:
            raise ValueError(f"condenser_keep_first must be >= 0, got {keep_first}")
        if not 0.0 <= keep_recent_fraction < 1.0:
            raise ValueError(f"condenser_keep_recent_fraction must be in [0, 1), got {keep_recent_fraction}")
        self.keep_first, self.target = int(keep_first), int(keep_recent_fraction * trigger_tokens)

    def compact(self, state, summary, measure):
        head = head_messages(state.messages)
        # [-1]: the summary turn
        body = [m for m in state.messages[:-1] if m.kind not in ("system", "task", "summary_query")]
        first = [m for m in body[:self.keep_first] if m.kind != "summary"]
        rest = [m for m in body[self.keep_first:] if m.kind != "summary"]
        kept = head + first + [Message("user", self.header + (summary or "(empty summary)"), kind="summary")]
        tail = list(rest)
        while tail and (measure(kept + tail) > self.target or tail[0].role == "observation"):
            tail.pop(0)
        return kept + tail


def make_strategy(cfg) -> ContextStrategy:
    """The strategy named by `cfg.context_strategy` (an `agent` config). Optional text fields
    (empty or absent = the defaults above, sized for real models): `summary_query`,
    `compaction_prompt`, `condenser_prompt`, `summary_header`, `state_template`,
    `observation_placeholder` — small environments shorten them."""
    s = cfg.context_strategy
    texts = dict(header=cfg.get("summary_header") or SUMMARY_HEADER,
                 state_template=cfg.get("state_template") or STATE_TEMPLATE)
    if s == "self_summary":
        return SelfSummary(cfg.trigger_tokens, cfg.summary_max_tokens, query_text=cfg.get("summary_query") or None,
                           **texts)
    if s == "prompt_compaction":
        return PromptCompaction(cfg.trigger_tokens, cfg.compaction_max_tokens,
                                query_text=cfg.get("compaction_prompt") or None, **texts)
    if s == "sliding_window":
        return SlidingWindow(cfg.trigger_tokens, cfg.sliding_window_keep_fraction)
    if s == "observation_masking":
        return ObservationMasking(cfg.trigger_tokens, cfg.observation_masking_keep_recent,
                                  cfg.get("observation_placeholder") or MASK_PLACEHOLDER)
    if s == "summarizing_condenser":
        return SummarizingCondenser(cfg.trigger_tokens, cfg.condenser_max_tokens, keep_first=cfg.condenser_keep_first,
                                    keep_recent_fraction=cfg.condenser_keep_recent_fraction,
                                    query_text=cfg.get("condenser_prompt") or None, header=texts["header"])
    if s == "none":
        return ContextStrategy(cfg.trigger_tokens)
    raise ValueError(f"unknown context_strategy {s!r}; use one of {' | '.join(STRATEGIES)}")


def summary_budget_field(strategy: str) -> str | None:
    """The agent-config field limiting `strategy`'s summary turn (None: no model call)."""
    return {"self_summary": "summary_max_tokens", "prompt_compaction": "compaction_max_tokens",
            "summarizing_condenser": "condenser_max_tokens"}.get(strategy)


def with_context_note(system_text: str, cfg) -> str:
    """`system_text` plus the one line `cfg.context_notes` gives the running `cfg.context_strategy`
    (none: unchanged). It tells the policy its context regime from the first token: a policy SFT'd
    on several strategies' chains otherwise cannot tell, before anything was masked or summarized,
    whether to keep a note (a masking policy seldom wrote its first one: docs/PERF.md, the
    self-summarization study "the copy forms on the fair mix")."""
    note = str((cfg.get("context_notes") or {}).get(str(cfg.context_strategy), "") or "")
    return f"{system_text} {note}".strip() if note else system_text


def validate_strategy_options(cfg, prefix: str, used) -> None:
    """The option fields of the strategies in `used` (names in `STRATEGIES`), read only when one
    is used (configs without them stay valid): summary budgets below `max_context_tokens`, the
    sliding window's fraction, masking's recent count and placeholder, the condenser's first/recent
    split (the sliding window's fraction is checked by `validate_agent_config` always). Raises
    `ConfigError` naming the field."""
    ctx = int(cfg.max_context_tokens)
    for s, note in (cfg.get("context_notes") or {}).items():
        need(s in STRATEGIES and isinstance(note, str), f"{prefix}.context_notes.{s}", note,
             f"keys must be strategies {STRATEGIES}, values one line of text")
    for s in used:
        f = summary_budget_field(s)
        if f is not None:
            need_int(cfg, f, prefix, lo=1)
            need(int(cfg[f]) < ctx, f"{prefix}.{f}", cfg[f], f"must be below {prefix}.max_context_tokens={ctx}")
    if "observation_masking" in used:
        need_int(cfg, "observation_masking_keep_recent", prefix, lo=0)
        ph = cfg.get("observation_placeholder") or MASK_PLACEHOLDER
        try:
            ph.format(lines=0)
        except (KeyError, IndexError, ValueError):
            need(False, f"{prefix}.observation_placeholder", ph, "may use only the {lines} field")
    if "summarizing_condenser" in used:
        need_int(cfg, "condenser_keep_first", prefix, lo=0)
        v = need_float(cfg, "condenser_keep_recent_fraction", prefix, 0.0, 1.0)
        need(v < 1.0, f"{prefix}.condenser_keep_recent_fraction", v, "must be below 1 (the recent part alone "
             "would fill the trigger)")
