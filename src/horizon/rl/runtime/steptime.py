"""Where an RL step's time goes (docs/PERF.md, "Studies at benchmark speed").

A step is a rollout phase then a train phase, each bracketed by `horizon.utils.compiles` snapshots.
`split` turns the phases' wall seconds, what they compiled and the rollout's engine usage
(`EnginePolicy.usage`, summed over the step's generation batches) into the record's ``time/*``:

- ``compile_s`` / ``compiles`` / ``compile_cache_hits``: tracing, lowering and backend compiles of the
  step (both phases; persistent-cache hits count as compiles that took their read time);
- ``gen_exec_s``: seconds in engine calls minus the rollout's compile seconds (device work and the
  engine's own host loop);
- ``tool_wait_s``: seconds the engine sat idle because every open episode was in a tool call;
- ``rollout_host_s``: the rest of the rollout (sandbox prepare/reset and verify, the agent's
  context building, tokenization);
- ``train_host_s`` (batch build + packing), ``train_exec_s`` (the train step minus its compiles);
- ``engine/occupancy``: generated tokens per decode slot-step (1 = every slot busy).
"""

from __future__ import annotations

from horizon.utils.compiles import Compiles

USAGE_KEYS = ("gen_s", "tool_wait_s", "slot_steps", "engine_tokens")


def add_usage(total: dict, info: dict) -> dict:
    """`total` plus one generation batch's engine usage (`core.rollout_groups`' info)."""
    return {k: total.get(k, 0) + info.get(k, 0) for k in USAGE_KEYS}


NAN = float("nan")          # occupancy of a remote engine: not visible here

def split(*, rollout_s: float, train_s: float, usage: dict, rollout_c: Compiles, train_c: Compiles,
          train_host_s: float) -> dict:
    """The step's ``time/*`` and ``engine/occupancy`` (module docstring)."""
    gen, wait = float(usage.get("gen_s", 0.0)), float(usage.get("tool_wait_s", 0.0))
    slot_steps = int(usage.get("slot_steps", 0))
    occupancy = {"engine/occupancy": float(usage.get("engine_tokens", 0)) / slot_steps} if slot_steps else {}
    return {
        "time/compile_s": rollout_c.seconds + train_c.seconds,
        "time/compiles": rollout_c.compiles + train_c.compiles,
        "time/compile_cache_hits": rollout_c.cache_hits + train_c.cache_hits,
        "time/rollout_compile_s": rollout_c.seconds,
        "time/gen_exec_s": max(gen - rollout_c.seconds, 0.0),
        "time/tool_wait_s": wait,
        "time/rollout_host_s": max(rollout_s - gen - wait, 0.0),
        "time/train_compile_s": train_c.seconds,
        "time/train_host_s": float(train_host_s),
        "time/train_exec_s": max(train_s - train_host_s - train_c.seconds, 0.0),
        **occupancy,                 # none for a remote engine (its slot-steps are the server's)
    }


def line(rec: dict) -> str:
    """The step's split as one printed line."""
    return (f"time: compile {rec['time/compile_s']:.1f}s ({rec['time/compiles']} executables, "
            f"{rec['time/compile_cache_hits']} from the persistent cache) | engine {rec['time/gen_exec_s']:.1f}s at "
            f"occupancy {rec.get('engine/occupancy', NAN):.2f}, idle on tools {rec['time/tool_wait_s']:.1f}s, "
            f"rollout host {rec['time/rollout_host_s']:.1f}s | train exec {rec['time/train_exec_s']:.1f}s, host "
            f"{rec['time/train_host_s']:.1f}s")
