"""Agent-loop config (docs/SPEC.md §5, §6): tiny model + an `agent` sub-config with every agent knob.

Token counts are in tokenizer ids (bytes for the ByteTokenizer). `agent_config()` is
importable on its own for tests and other configs.
"""

import ml_collections

from horizon.utils.config import sibling_config


def agent_config() -> ml_collections.ConfigDict:
    a = ml_collections.ConfigDict()
    a.max_turns = 40                  # assistant (non-summary) turns before the episode ends
    a.max_total_tokens = 200_000      # budget on model-generated tokens over the whole chain
    a.max_context_tokens = 16_384     # hard context limit (model max length); "context_full" past it
    a.max_new_tokens = 1024           # per ordinary assistant turn
    a.context_strategy = "self_summary"  # horizon.agent.summarize.STRATEGIES: "self_summary" | "prompt_compaction" |
    #                                   "sliding_window" | "observation_masking" | "summarizing_condenser" | "none"
    a.trigger_tokens = 8192           # compaction trigger on the current context length (docs/SPEC.md §6 step 1)
    a.summary_max_tokens = 1024       # self-summary generation limit (scratch thinking + summary)
    a.compaction_max_tokens = 4096    # prompt_compaction baseline's (longer) summary limit
    a.sliding_window_keep_fraction = 0.75  # sliding_window drops oldest turns to below this * trigger
    a.observation_masking_keep_recent = 1  # observation_masking: tool outputs kept verbatim, most recent first
    #                                   (Lindenbauer et al. 2025 keep a window of M = 10 turns; tiny contexts
    #                                   hold fewer)
    a.condenser_max_tokens = 4096     # summarizing_condenser's summary limit (its prompt is as long as compaction's)
    a.condenser_keep_first = 0        # summarizing_condenser: events kept verbatim after system + task (OpenHands
    #                                   SDK keep_first=4 counts the system prompt and task among its events)
    a.condenser_keep_recent_fraction = 0.5  # summarizing_condenser: recent turns kept verbatim while the new context
    #                                   (head + summary + them) stays within this * trigger (OpenHands:
    #                                   max_size // 2 events)
    # strategy texts ("" = horizon.agent.summarize defaults, sized for real models; small envs shorten them)
    a.summary_query = ""              # self_summary's short query
    a.compaction_prompt = ""          # prompt_compaction's long, sectioned query
    a.condenser_prompt = ""           # summarizing_condenser's query (OpenHands-style state sections)
    a.observation_placeholder = ""    # observation_masking's stand-in for an old tool output ({lines} field)
    a.context_notes = ml_collections.ConfigDict()   # strategy -> one line added to the system prompt (empty: none)
    a.summary_header = ""             # prefix of the summary message in the new context
    a.state_template = ""             # conversation-state message: {summaries} {turns} {max_turns} {todos}
    a.tool_timeout_s = 30.0           # default run_shell / helper-command timeout
    a.max_tool_timeout_s = 120.0      # cap on a model-requested run_shell timeout
    a.max_observation_bytes = 8192    # tool output clipped (head + tail kept) to this size
    a.strict_tools = True             # strict argument checking (training); False = lenient
    a.tool_format = "horizon"         # tool-call text format (horizon.tools.format.FORMATS: "horizon" |
    #                                   "hermes"); the SFT demonstrators write "horizon"
    a.max_malformed_calls = 3         # episode ends when this many turns failed to parse
    a.max_parallel_calls = 1          # tool calls one turn may hold, run at the same time (docs/SPEC.md §5);
    #                                   1 = one call per turn (a second is a malformed turn)
    a.max_steps = 0                   # driver rounds before "max_steps" ends an episode; 0 = derived from the two
    #                                   above (horizon.agent.rollout.episode_step_limit)
    a.num_tool_workers = 8            # threads executing tool calls (run_episodes' pool, both schedules)
    a.include_file_listing = True     # the task message shows the top of the workspace tree
    a.file_listing_max_bytes = 1024
    a.tool_sets = ml_collections.ConfigDict(dict(
        default=["read_file", "edit_file", "run_shell", "grep", "list_dir", "todo_write"],
        question=["read_file", "run_shell", "grep", "list_dir"],   # answer-only tasks: no editing
        recall=["read_file", "run_shell", "grep", "list_dir", "edit_file"],
    ))
    return a


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "tiny.py")
    c.agent = agent_config()
    return c
