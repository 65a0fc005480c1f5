"""Context strategies: self-summarization and its baselines (SPEC §6).

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
- `none`: never compacts (the episode ends with "context_full" at the hard limit).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from horizon.agent.prompt import Message

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
    """The conversation-state message after a compaction (SPEC §6 step 4); `template` fields:
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


def make_strategy(cfg) -> ContextStrategy:
    """The strategy named by `cfg.context_strategy` (an `agent` config). Optional text fields
    (empty or absent = the defaults above, sized for real models): `summary_query`,
    `compaction_prompt`, `summary_header`, `state_template` — small environments shorten them."""
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
    if s == "none":
        return ContextStrategy(cfg.trigger_tokens)
    raise ValueError(f"unknown context_strategy {s!r}; use self_summary | prompt_compaction | "
                     "sliding_window | none")
