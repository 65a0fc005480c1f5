"""horizon.agent: the rollout state machine, prompts, context strategies and scripted policies (docs/SPEC.md §5, §6).

`Generation` (what a policy returns) is `horizon.inference.policy`'s, re-exported here for policies."""

from horizon.agent.prompt import Message, Rendered, render, split_turns, system_prompt
from horizon.agent.rollout import (
    Episode,
    Segment,
    Trajectory,
    episode_step_limit,
    rollout,
    run_episodes,
    validate_agent_config,
)
from horizon.agent.scripted import RecallScriptedPolicy, ScriptedPolicy, script_from_task
from horizon.agent.stats import STATS_KEYS
from horizon.agent.summarize import (
    COMPACTION_PROMPT,
    CONDENSER_PROMPT,
    STRATEGIES,
    SUMMARY_QUERY,
    ContextState,
    ContextStrategy,
    ObservationMasking,
    PromptCompaction,
    SelfSummary,
    SlidingWindow,
    SummarizingCondenser,
    make_strategy,
)
from horizon.inference.policy import Generation

__all__ = ["Message", "Rendered", "render", "split_turns", "system_prompt", "STATS_KEYS", "Episode",
           "Generation", "Segment", "Trajectory", "episode_step_limit", "rollout", "run_episodes",
           "validate_agent_config",
           "RecallScriptedPolicy", "ScriptedPolicy", "script_from_task", "COMPACTION_PROMPT", "SUMMARY_QUERY",
           "ContextState", "ContextStrategy", "PromptCompaction", "SelfSummary", "SlidingWindow", "make_strategy",
           "CONDENSER_PROMPT", "STRATEGIES", "ObservationMasking", "SummarizingCondenser"]
