"""The per-episode stats the agent loop counts (docs/SPEC.md §4, §6): the effort the length penalty
weighs, the behaviour hooks read and the eval harness reports.

Every generated token is counted in exactly one of ``thinking_tokens`` (``<think>`` blocks, and all
summary-turn tokens), ``tool_call_tokens`` (the rest of call turns and of malformed turns) and
``final_tokens`` (the rest of the final turn); ``tool_output_tokens`` counts observation tokens;
``summary_tokens`` counts the summary turns' tokens again on their own (the cost self-summarization
is compared on). ``tool_calls`` counts every call; ``parallel_calls`` the calls made in turns that held
more than one (`agent.max_parallel_calls`), so parallel_calls / tool_calls is the parallel-call rate.
"""

STATS_KEYS = (      # the one list: `horizon.agent.rollout.Episode` fills exactly these per episode
    "thinking_tokens", "tool_call_tokens", "tool_output_tokens", "final_tokens",
    "tool_calls", "turns", "summaries", "todos_created", "todos_completed", "malformed_calls", "summary_tokens",
    "parallel_calls",
)
