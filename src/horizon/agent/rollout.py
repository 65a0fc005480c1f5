"""The agent loop as a resumable state machine (docs/SPEC.md §5, §6).

`Episode` holds one rollout: `context_tokens()` is what to generate from, `step(gen)`
parses the generated turn, executes the tool call in the sandbox, appends the
observation and compacts the context when the trigger is reached. The RL driver can
therefore batch generation over many episodes (`run_episodes`). A rollout is a chain
of `Segment`s: a new segment starts whenever the context is rewritten (summary or
window drop); each generated token is in the loss mask of the segment it was generated in, and
only there: turns kept across a rewrite are that segment's context (`prompt.carry_over`).

Stats: `horizon.agent.stats.STATS_KEYS`, counted per episode as that module says.

End reasons: "final", "max_turns", "token_budget" (generated tokens over the chain),
"malformed" (max_malformed_calls unparsable turns), "context_full" (the hard context
limit leaves no room to generate), "max_steps" (driver limit) — the policy's outcomes — and
"resource" (the policy's commands exceeded a sandbox budget, e.g. disk: also the policy's) and
"infra" (the sandbox or engine failed: `SandboxInfraError`; `Trajectory.failure` says how). An
"infra" episode is never trained on or scored (docs/SPEC.md §4 "infrastructure is not the policy"):
`horizon.env.rollouts` retries its group on a fresh sandbox.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from jaxtyping import Bool, Float, Int

from horizon.agent.prompt import Message, carry_over, render, system_prompt, task_text
from horizon.agent.stats import STATS_KEYS
from horizon.agent.summarize import (
    STRATEGIES,
    ContextState,
    make_strategy,
    validate_strategy_options,
    with_context_note,
)
from horizon.data.tokenizer import ByteTokenizer
from horizon.inference.policy import Generation, Policy
from horizon.sandbox.base import SandboxInfraError, SandboxResourceError
from horizon.tools.builtin import registry_for
from horizon.tools.format import FORMATS, ParseError, join_results, parallel_calls_rule, tool_format
from horizon.tools.registry import ToolContext, ToolRegistry, ToolState, truncate_text
from horizon.utils.config import need, need_choice, need_float, need_int

INFRA_END = "infra"          # the one end reason that is not the policy's (module docstring)
RESOURCE_END = "resource"


@dataclasses.dataclass
class Segment:
    """One trainer row of a chain: a context and the model tokens in it."""

    tokens: Int[np.ndarray, " n"]
    loss_mask: Bool[np.ndarray, " n"]
    logprobs: Float[np.ndarray, " n"]
    policy_versions: Int[np.ndarray, " n"]
    router_indices: Any = None          # int32[L_moe, n, k] (-1 off the generated tokens) or None


@dataclasses.dataclass
class Trajectory:
    task_id: str
    segments: list[Segment]
    final_answer: str
    stats: dict[str, int]
    end_reason: str
    failure: str = ""       # the sandbox error behind an "infra" / "resource" end

    @property
    def infra(self) -> bool:
        """The sandbox failed, not the policy: retry, never train or score (module docstring)."""
        return self.end_reason == INFRA_END

    @property
    def num_generated_tokens(self) -> int:
        return int(sum(s.loss_mask.sum() for s in self.segments))


def validate_agent_config(cfg, prefix: str = "agent", strategies: Sequence[str] = (),
                          strategies_field: str = "strategies", max_seq_len: int | None = None) -> None:
    """Check an `agent` config (configs/agent_tiny.py) before any episode: strategy names, positive
    budgets, and a trigger below the context limit with room for a turn's generation and for the
    summary of `cfg.context_strategy` and of each of `strategies` (a driver that runs several,
    named `strategies_field` in errors); the context limit fits `max_seq_len` when given.
    Raises `ConfigError` (a ValueError) naming the field, e.g. `agent.trigger_tokens=999999: ...`."""
    need_choice(cfg, "context_strategy", prefix, STRATEGIES)
    if "tool_format" in cfg:
        need_choice(cfg, "tool_format", prefix, tuple(FORMATS))
    for s in strategies:
        need(s in STRATEGIES, strategies_field, s, f"each must be one of {STRATEGIES}")
    for k in ("max_turns", "max_total_tokens", "max_context_tokens", "max_new_tokens", "trigger_tokens",
              "summary_max_tokens", "compaction_max_tokens", "max_observation_bytes", "max_malformed_calls",
              "num_tool_workers"):
        need_int(cfg, k, prefix, lo=1)
    ctx = int(cfg.max_context_tokens)
    if max_seq_len is not None:
        need(ctx <= max_seq_len, f"{prefix}.max_context_tokens", ctx, f"must be <= model.max_seq_len={max_seq_len}")
    need(int(cfg.trigger_tokens) < ctx, f"{prefix}.trigger_tokens", cfg.trigger_tokens,
         f"must be below {prefix}.max_context_tokens={ctx} (the compaction trigger fires before the context is full)")
    used = {cfg.context_strategy, *strategies}
    budgets = ["max_new_tokens"] + (["summary_max_tokens"] if "self_summary" in used else []) + (
        ["compaction_max_tokens"] if "prompt_compaction" in used else [])
    for k in budgets:
        need(int(cfg[k]) < ctx, f"{prefix}.{k}", cfg[k], f"must be below {prefix}.max_context_tokens={ctx}")
    validate_strategy_options(cfg, prefix, used)
    need_float(cfg, "sliding_window_keep_fraction", prefix, 0.0, 1.0, lo_open=True)
    need_float(cfg, "tool_timeout_s", prefix, 0.0, lo_open=True)
    need_float(cfg, "max_tool_timeout_s", prefix, float(cfg.tool_timeout_s))
    if "max_steps" in cfg:
        need_int(cfg, "max_steps", prefix, lo=0)
    if "max_parallel_calls" in cfg:
        need_int(cfg, "max_parallel_calls", prefix, lo=1)


def _clip_generation(gen: Generation, tok) -> Generation:
    """Cut anything after the first stop id (end of turn / EOS; the policy should already stop there)."""
    toks = np.asarray(gen.tokens, np.int32).reshape(-1)
    lps = np.asarray(gen.logprobs, np.float32).reshape(-1)
    if lps.shape != toks.shape:
        raise ValueError(f"Generation logprobs shape {lps.shape} != tokens shape {toks.shape}")
    stop = np.nonzero(np.isin(toks, tok.stop_ids))[0]
    n = int(stop[0]) + 1 if len(stop) else len(toks)
    ri = None if gen.router_indices is None else np.asarray(gen.router_indices, np.int32)[:, :n]
    if ri is not None and ri.shape[1] != n:
        raise ValueError(f"router_indices covers {ri.shape[1]} tokens, generation has {n}")
    vers = gen.versions()
    if vers.shape[0] < n:
        raise ValueError(f"policy_version has {vers.shape[0]} entries for {n} tokens")
    return Generation(toks[:n], lps[:n], ri, vers[:n])


class Episode:
    """One rollout as a state machine: context_tokens() -> policy -> step(gen) ... until done."""

    def __init__(self, task, sandbox, registry: ToolRegistry, tokenizer, cfg, *, system_text: str = ""):
        """`system_text`: the system message ("" = `prompt.system_prompt` of the registry's tools, e.g. a
        task family's own); either way the strategy's `agent.context_notes` line ends it."""
        validate_agent_config(cfg)
        self.task, self.sandbox, self.registry, self.tok, self.cfg = task, sandbox, registry, tokenizer, cfg
        self.strategy = make_strategy(cfg)
        self.fmt = tool_format(str(cfg.get("tool_format", "horizon")))   # the turn parser (docs/SPEC.md §5)
        self.max_calls = int(cfg.get("max_parallel_calls", 1))           # tool calls one turn may hold
        self.tool_state = ToolState()
        self.ctx = ToolContext(sandbox, self.tool_state, timeout_s=float(cfg.tool_timeout_s),
                               max_timeout_s=float(cfg.max_tool_timeout_s),
                               max_observation_bytes=int(cfg.max_observation_bytes))
        self.stats = {k: 0 for k in STATS_KEYS}
        self.segments: list[Segment] = []
        self.final_answer = ""
        self.end_reason = ""
        self.done = False
        self.phase = "act"                   # "act" | "summarize"
        self._turns_at_compaction = -1       # no second compaction before a new turn (see _maybe_compact)
        self._pending_calls = ()             # the turn's parsed ToolCalls awaiting execute_pending()
        self.generated_tokens = 0
        self.failure = ""
        dead = None
        try:
            listing = self._file_listing() if cfg.include_file_listing else None
        except SandboxInfraError as e:
            listing, dead = None, e
        self._ctx_cache: tuple[list, np.ndarray | None] = ([], None)   # (messages rendered, ids)
        sys_text = system_text or system_prompt(registry, self.fmt)
        sys_text = with_context_note("\n".join(filter(None, (sys_text, parallel_calls_rule(self.max_calls)))), cfg)
        self.messages = [Message("system", sys_text, kind="system"),
                         Message("user", task_text(task, listing), kind="task")]
        if dead is not None:
            self._fail(INFRA_END, dead)

    # -- context ---------------------------------------------------------------------------
    def _file_listing(self) -> str | None:
        try:
            res = self.sandbox.exec("find /workspace -mindepth 1 -maxdepth 2 -name '.*' -prune -o -print "
                                    "| LC_ALL=C sort", timeout=self.cfg.tool_timeout_s)
        except SandboxInfraError:
            raise
        except Exception:
            return None
        return truncate_text(res.output.strip(), int(self.cfg.file_listing_max_bytes)) if res.ok else None

    def _measure(self, messages) -> int:
        return len(render(messages, self.tok, add_generation_prompt=True).tokens)

    def context_tokens(self) -> Int[np.ndarray, " n"]:
        """The ids to generate from (ends with a bare ASSISTANT token). Rendered once per message
        list: a turn asks for them up to three times (`has_room`, `max_new_tokens`, the policy),
        and messages are only ever appended or replaced, never edited in place."""
        cached, tokens = self._ctx_cache
        if len(cached) != len(self.messages) or any(a is not b for a, b in zip(cached, self.messages)):
            tokens = render(self.messages, self.tok, add_generation_prompt=True).tokens
            self._ctx_cache = (list(self.messages), tokens)
        return tokens

    def max_new_tokens(self) -> int:
        """Generation limit for the next turn (summary turns get the strategy's limit)."""
        limit = self.strategy.summary_max_tokens if self.phase == "summarize" else int(self.cfg.max_new_tokens)
        room = int(self.cfg.max_context_tokens) - len(self.context_tokens())
        return max(0, min(limit, room))

    def has_room(self) -> bool:
        """Whether the next turn can generate at all; if not (a first prompt that already fills
        `max_context_tokens`), the episode ends "context_full" without a policy call."""
        if not self.done and self.max_new_tokens() <= 0:
            self._finish("context_full")
        return not self.done

    # -- transitions -----------------------------------------------------------------------
    def _finish(self, reason: str) -> None:
        if self.done:
            return
        self.done, self.end_reason = True, reason
        self._close_segment()
        self.stats["todos_created"] = self.tool_state.todos_created
        self.stats["todos_completed"] = self.tool_state.todos_completed

    def _fail(self, reason: str, e: Exception) -> None:
        self.failure = f"{type(e).__name__}: {e}"
        self._finish(reason)

    def _close_segment(self) -> None:
        r = render(self.messages, self.tok)
        self.segments.append(Segment(r.tokens, r.loss_mask, r.logprobs, r.policy_versions, r.router_indices))

    def _observe(self, text: str) -> None:
        self.messages.append(Message("observation", text))
        self.stats["tool_output_tokens"] += len(self.tok.encode(text))

    def step(self, gen: Generation, *, defer_tools: bool = False) -> None:
        """Consume one generated turn: parse, execute the tool call in the sandbox, append the
        observation, check end conditions and compaction (no-op when done). With
        `defer_tools=True` the parsed call waits for `after_tools()` (drivers run those in threads)."""
        if self.done:
            return
        gen = _clip_generation(gen, self.tok)
        m = len(gen.tokens)
        self.generated_tokens += m
        self.messages.append(Message("assistant", tokens=gen.tokens, logprobs=gen.logprobs,
                                     router_indices=gen.router_indices, policy_versions=gen.versions()))
        text = self.tok.decode(gen.tokens)
        if self.phase == "summarize":
            self._after_summary(text, m)
        else:
            self._after_action(text, m)
        if self.done:
            return
        if not self._pending_calls:
            self._post_turn()
        elif not defer_tools:
            self.after_tools()

    def _post_turn(self) -> None:
        """End conditions, then the compaction check (docs/SPEC.md §6 step 1)."""
        if self.generated_tokens >= int(self.cfg.max_total_tokens):
            return self._finish("token_budget")
        if self.phase == "act" and self.stats["turns"] >= int(self.cfg.max_turns):
            return self._finish("max_turns")
        self._maybe_compact()
        self.has_room()

    def _think_tokens(self, thinking: str, m: int) -> int:
        return min(m, len(self.tok.encode(f"<think>{thinking}</think>"))) if thinking else 0

    def _after_action(self, text: str, m: int) -> None:
        self.stats["turns"] += 1
        act = self.fmt.parse_action(text, self.max_calls)
        think = self._think_tokens(act.thinking, m)
        self.stats["thinking_tokens"] += think
        if isinstance(act, ParseError):
            self.stats["tool_call_tokens"] += m - think
            self.stats["malformed_calls"] += 1
            self._observe(act.observation())
            if self.stats["malformed_calls"] >= int(self.cfg.max_malformed_calls):
                self._finish("malformed")
            return
        if act.kind == "final":
            self.stats["final_tokens"] += m - think
            self.final_answer = act.final
            return self._finish("final")
        self.stats["tool_call_tokens"] += m - think
        self._pending_calls = act.tool_calls()
        self.stats["tool_calls"] += len(self._pending_calls)
        self.stats["parallel_calls"] += len(self._pending_calls) if len(self._pending_calls) > 1 else 0

    def execute_pending(self) -> None:
        """Run the turn's tool calls (several at the same time, `ToolRegistry.execute_all`) and append
        their one observation (`format.join_results`)."""
        calls, self._pending_calls = self._pending_calls, ()
        if not calls:
            return
        try:
            res = self.registry.execute_all([(c.name, c.args) for c in calls], self.ctx)
        except SandboxInfraError as e:
            return self._fail(INFRA_END, e)
        except SandboxResourceError as e:
            return self._fail(RESOURCE_END, e)
        self._observe(join_results(calls, [r.output for r in res]))

    def _after_summary(self, text: str, m: int) -> None:
        self.stats["thinking_tokens"] += m      # summary turns count as thinking (see module doc)
        self.stats["summary_tokens"] += m       # ... and, separately, as summary tokens (docs/SPEC.md §6 cost)
        parsed = self.fmt.parse_summary(text)
        summary = None if isinstance(parsed, ParseError) else parsed[1]
        if summary is None:
            self.stats["malformed_calls"] += 1
        self._rewrite(self.strategy.compact(self._state(), summary, self._measure))
        self.stats["summaries"] += 1
        self.phase = "act"
        if self.stats["malformed_calls"] >= int(self.cfg.max_malformed_calls):
            self._finish("malformed")

    def _maybe_compact(self) -> None:
        # A compaction needs a new turn since the last one: a summary that leaves the context above
        # the trigger would otherwise be re-summarized at once, forever (the episode then runs into
        # the hard context limit or the token budget instead, which is the honest cost of it).
        if self.phase != "act" or self.stats["turns"] == self._turns_at_compaction:
            return
        n = len(self.context_tokens())
        if not self.strategy.should_compact(n):
            return
        self._turns_at_compaction = self.stats["turns"]
        q = self.strategy.query()
        if q is not None:
            self.messages.append(q)
            self.phase = "summarize"
            return
        new = self.strategy.compact(self._state(), None, self._measure)
        if len(new) != len(self.messages) or any(a is not b for a, b in zip(new, self.messages)):
            self._rewrite(new)          # something dropped or rewritten (e.g. masked)

    def _state(self) -> ContextState:
        return ContextState(self.messages, self.stats["summaries"], self.stats["turns"],
                            int(self.cfg.max_turns), self.tool_state.remaining_todos())

    def _rewrite(self, new: list[Message]) -> None:
        """A context rewrite: the old context becomes a segment, `new` the next one's messages, its
        kept generated turns carried (`prompt.carry_over`: rendered, not trained again)."""
        self._close_segment()
        self.messages = carry_over(new)

    def after_tools(self) -> None:
        """Execute a deferred tool call, then the end-condition and compaction checks."""
        if self.done or not self._pending_calls:
            return
        self.execute_pending()
        if not self.done:
            self._post_turn()

    def trajectory(self) -> Trajectory:
        if not self.done:
            raise RuntimeError("episode is not done; call trajectory() after it ends")
        return Trajectory(str(getattr(self.task, "id", "")), list(self.segments), self.final_answer,
                          dict(self.stats), self.end_reason, self.failure)


def run_episodes(policy: Policy, episodes: Sequence[Episode], *, max_steps: int | None = None,
                 num_tool_workers: int = 1) -> list[Trajectory]:
    """Drive `episodes` to their end and return their trajectories. `max_steps` (driver rounds per
    episode: a generation and its tool call) defaults to `episode_step_limit` of the episodes' agent
    config. Two schedules, chosen by the policy:

    * **lockstep** (a batched ``policy(contexts, max_new)``): each round, one policy call per
      distinct generation limit over every active episode, then all tool calls (in
      `num_tool_workers` threads); the slowest episode gates the round. What scripted policies (SFT
      demonstrators, `eval.harness.scripted_policy`) and other plain callables get.
    * **independent** (a policy with ``stream()``, `horizon.inference.policy.EnginePolicy`): every
      episode's turn is submitted as soon as its previous tool call returned; the stream's
      ``advance()`` (one engine round-trip) hands back finished generations, whose tool calls run at
      once in a bounded pool of `num_tool_workers` threads while the engine decodes the others;
      a finished episode's cache is released (`_run_independent`). What every RL and eval caller
      gets (`horizon.inference.policy.rollout_policy`, on one device or a mesh).
    """
    if max_steps is None:
        max_steps = max((episode_step_limit(e.cfg) for e in episodes), default=0)
    independent = callable(getattr(policy, "stream", None))
    workers = max(1, num_tool_workers) if independent else num_tool_workers
    pool = ThreadPoolExecutor(workers) if workers > 1 or independent else None
    try:
        if independent:
            _run_independent(policy.stream(), episodes, max_steps, pool)
        else:
            _run_lockstep(policy, episodes, max_steps, pool)
        for e in episodes:
            e._finish("max_steps")
    finally:
        if pool is not None:
            pool.shutdown()
    return [e.trajectory() for e in episodes]


def _run_lockstep(policy: Policy, episodes: Sequence[Episode], max_steps: int, pool) -> None:
    for _ in range(max_steps):
        active = [e for e in episodes if e.has_room()]
        if not active:
            break
        groups: dict[int, list[Episode]] = {}
        for e in active:
            groups.setdefault(e.max_new_tokens(), []).append(e)
        for limit, eps in groups.items():
            gens = policy([e.context_tokens() for e in eps], limit)
            if len(gens) != len(eps):
                raise ValueError(f"policy returned {len(gens)} generations for {len(eps)} contexts")
            for e, g in zip(eps, gens):
                e.step(g, defer_tools=True)
        todo = [e for e in active if not e.done]
        if pool is not None:
            list(pool.map(lambda e: e.after_tools(), todo))
        else:
            for e in todo:
                e.after_tools()


def _turn(e: Episode, gen: Generation) -> None:
    """One episode's turn after its generation: parse, tool call, end and compaction checks."""
    e.step(gen, defer_tools=True)
    e.after_tools()


def _run_independent(stream, episodes: Sequence[Episode], max_steps: int, pool) -> None:
    """Each episode advances on its own (`run_episodes`): submit its next turn when ready, run its
    tool call in `pool` when its generation finishes, at most `max_steps` turns per episode. The
    calling thread owns the stream (engine); tool threads report back through a queue."""
    back: queue.Queue = queue.Queue()
    ready = list(range(len(episodes)))
    turns = [0] * len(episodes)
    in_tools = 0

    def tools(i: int, gen: Generation) -> None:
        try:
            _turn(episodes[i], gen)
            back.put((i, None))
        except BaseException as exc:  # noqa: BLE001  (re-raised in the driver thread)
            back.put((i, exc))

    def returned(item) -> None:
        nonlocal in_tools
        i, exc = item
        in_tools -= 1
        if exc is not None:
            raise exc
        ready.append(i)

    while True:
        for i in ready:
            e = episodes[i]
            if not e.has_room() or turns[i] >= max_steps:
                stream.release(i)
                continue
            turns[i] += 1
            stream.submit(i, e.context_tokens(), e.max_new_tokens())
        ready.clear()
        if stream.busy:
            for i, gen in stream.advance():
                in_tools += 1
                pool.submit(tools, i, gen)
        elif in_tools:
            t0 = time.perf_counter()
            item = back.get()
            stream.idle(time.perf_counter() - t0)     # the engine had nothing to do meanwhile
            returned(item)
        else:
            break
        while not back.empty():
            returned(back.get_nowait())


def episode_step_limit(cfg) -> int:
    """Driver rounds (a generation or a tool round each) before `run_episodes` ends an episode with
    "max_steps": `cfg.max_steps`, or when that is 0, two rounds per turn and per malformed call plus
    slack for summary turns (`2 * (max_turns + max_malformed_calls) + 8`). A derived value computed
    at use, so an override of `max_turns` moves it."""
    explicit = int(cfg.get("max_steps", 0) or 0)
    return explicit if explicit > 0 else 2 * (int(cfg.max_turns) + int(cfg.max_malformed_calls)) + 8


def rollout(policy: Policy, task, sandbox, cfg, *, registry: ToolRegistry | None = None,
            tokenizer=None, max_steps: int | None = None) -> Trajectory:
    """One episode of `task` in `sandbox` (left open for the verifier; the caller closes it).
    `cfg` is the `agent` sub-config."""
    registry = registry if registry is not None else registry_for(cfg, getattr(task, "kind", None))
    ep = Episode(task, sandbox, registry, tokenizer or ByteTokenizer(), cfg)
    return run_episodes(policy, [ep], max_steps=max_steps)[0]
