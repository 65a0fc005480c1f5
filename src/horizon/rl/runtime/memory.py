"""Memory of the RL trainer step before a run starts (docs/SPEC.md §4).

A long-context RL run (configs/rl_swegen.py: 4k tokens) died in its first train step, after the
sandboxes, the warm start and the step-0 eval had run, on a 99.8 GB allocation. This module asks
XLA for the step's memory up front: `trainer.compile_train_step` on abstract shapes
(`jax.eval_shape` state, `batch.batch_shapes` batch: nothing allocated), `Compiled.memory_analysis()`.

- `max_step_shape(c)`: the largest batch the run can produce: ``rl.prompts_per_step x
  rl.group_size`` chains of at most `max_segments_per_chain` segments (rows bucketed like
  `batch.build_batch`, `rl.batch.min_rows`), each at most ``min(agent.max_context_tokens,
  model.max_seq_len)`` tokens (bucketed with `rl.batch.min_seq`; rollouts trim a segment after its
  last model token, which lies inside the context), split like `batch.split_microbatches` when
  `rl.batch.micro_rows` > 0 (worst case: every chain has the most segments).
- `step_memory(c, shape)`: XLA's temporaries, arguments, outputs and donated (aliased) bytes of
  the compiled step, per device; `StepMemory.needed` = the step's peak on the machine (per device
  x devices of the mesh on CPU, whose devices share host memory).
- `check_step_memory(c)`: raise a one-line `ConfigError` naming the bytes needed and available and
  the knobs (`rl.batch.micro_rows`, `model.remat`) when ``needed > rl.memory_check.fraction x
  available``; `rl.memory_check.enabled=False` skips it. experiments/rl.py calls it before any
  sandbox, warm start or eval. benchmarks/rl_step_memory.py prints the same numbers.
- `release_compiled_if_near_limit(c)`: between the runs of a long-lived driver (experiments/selfsum.py:
  seeds x strategies in one process), drop every compiled executable when the process holds more than
  `rl.memory_check.mappings_fraction` of Linux's `vm.max_map_count`. Each XLA CPU executable keeps ~10^3
  memory mappings; at the limit LLVM's next compile fails ("Unable to allocate section memory") and the
  process dies with host memory to spare (docs/PERF.md).
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from horizon.model import transformer
from horizon.parallel import mesh as pmesh
from horizon.rl.algo import batch as rlbatch
from horizon.rl.algo import trainer
from horizon.utils import cli
from horizon.utils.config import ConfigError
from horizon.utils.shapes import bucket

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class StepShape:
    """A train step's batch: `rows` x `seq` (bucketed, `build_batch`'s R and S), `groups` (Nb), and
    with `micro_rows` > 0 `microbatches` (M) micro-batches of that many rows."""

    rows: int
    seq: int
    groups: int
    micro_rows: int = 0
    microbatches: int = 1

    def describe(self) -> str:
        if self.micro_rows > 0:
            return f"{self.microbatches} micro-batches of {self.micro_rows} x {self.seq} tokens"
        return f"{self.rows} x {self.seq} tokens"


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """XLA's accounting of one compiled step (bytes per device) on `devices` devices."""

    shape: StepShape
    temp: int
    args: int
    out: int
    alias: int
    devices: int
    host_shared: bool          # CPU: the devices share the host's memory

    @property
    def per_device(self) -> int:
        """The step's peak per device: temporaries + arguments + outputs not aliased to (donated) inputs."""
        return self.temp + self.args + self.out - self.alias

    @property
    def needed(self) -> int:
        """Bytes the step needs from the memory `available_bytes` reports."""
        return self.per_device * (self.devices if self.host_shared else 1)

    def line(self) -> str:
        return (f"{self.shape.describe()}: temp {self.temp / GIB:.2f} GiB, args {self.args / GIB:.2f} GiB, "
                f"out {self.out / GIB:.2f} GiB, donated {self.alias / GIB:.2f} GiB"
                + (f" (per device, x{self.devices})" if self.devices > 1 else ""))


def max_segments_per_chain(c) -> int:
    """The most segments an episode can close: 1 with no context strategy ("none"), else one per
    compaction (at most one per turn, none after the last) plus the final one: `agent.max_turns`.
    Every strategy a run uses counts (`agent.context_strategy`, `exp.strategies`)."""
    strategies = {str(c.agent.get("context_strategy", "none"))}
    if "exp" in c:
        strategies |= {str(s) for s in c.exp.get("strategies", ())}
    return 1 if strategies <= {"none"} else max(1, int(c.agent.max_turns))


def step_shape(c, *, chains: int, segments_per_chain: int, seq: int, groups: int | None = None) -> StepShape:
    """The batch `build_batch_from_config` makes of `chains` chains (in `groups` prompt groups,
    default chains / `rl.group_size`) of `segments_per_chain` segments each, the longest `seq`
    tokens: rows and seq bucketed by `rl.batch`, split into micro-batches of `rl.batch.micro_rows`
    whole chains (first fit: ``micro_rows // segments_per_chain`` chains each)."""
    b = c.rl.batch
    G = int(c.rl.group_size)
    groups = groups if groups is not None else -(-int(chains) // G)
    R = bucket(int(chains) * int(segments_per_chain), int(b.min_rows))
    S = bucket(int(seq), int(b.min_seq))
    Nb = bucket(int(groups), int(b.min_groups))
    micro = int(b.get("micro_rows", 0) or 0)
    if micro <= 0:
        return StepShape(R, S, Nb)
    if segments_per_chain > micro:
        raise ConfigError(f"rl.batch.micro_rows={micro}: a chain can have {segments_per_chain} segments "
                          f"(agent.max_turns with a context strategy) and must fit one micro-batch: raise it")
    per_bin = micro // int(segments_per_chain)
    return StepShape(R, S, Nb, micro, -(-int(chains) // per_bin))


def max_step_shape(c) -> StepShape:
    """The largest batch a train step of the run can see (module docstring)."""
    P = int(c.rl.prompts_per_step)
    seq = min(int(c.agent.max_context_tokens), int(c.model.max_seq_len))
    return step_shape(c, chains=P * int(c.rl.group_size), segments_per_chain=max_segments_per_chain(c), seq=seq,
                      groups=P)


def abstract_state(c):
    """The `RLState` `trainer.init_state` would make for `c` (with its KL reference), as shapes on
    the run's mesh: nothing allocated."""
    shapes = jax.eval_shape(lambda: trainer.init_state(transformer.init(jax.random.key(0), c.model), c))
    mesh = pmesh.run_mesh(c)
    if mesh is None:
        return shapes
    sh = trainer.state_shardings(shapes, c, mesh)
    return jax.tree.map(lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h), shapes, sh)


def abstract_batch(c, shape: StepShape) -> dict:
    """`shape`'s batch as `jax.ShapeDtypeStruct`s (`batch.batch_shapes`)."""
    L = transformer.layer_counts(c.model)[1]
    spec = rlbatch.batch_shapes(shape.rows, shape.seq, groups=shape.groups, group_size=int(c.rl.group_size),
                                num_moe_layers=L, experts_per_tok=int(c.model.num_experts_per_tok),
                                micro_rows=shape.micro_rows, microbatches=shape.microbatches)
    return {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in spec.items()}


def step_memory(c, shape: StepShape | None = None) -> StepMemory:
    """XLA's memory of the RL train step for `c` on a `shape` batch (default: `max_step_shape`),
    compiled ahead of time from abstract shapes (one compile, no arrays; with the run's persistent
    compilation cache the run's own compile of that shape hits it)."""
    shape = shape if shape is not None else max_step_shape(c)
    state = abstract_state(c)
    compiled = trainer.compile_train_step(state, abstract_batch(c, shape), cfg=c)
    m = compiled.memory_analysis()
    mesh = pmesh.run_mesh(c)
    devices = 1 if mesh is None else int(mesh.devices.size)
    # a split batch compiles the micro-batch step: the optimizer state is live beside it, not its argument
    opt = _bytes_per_device(state.opt_state) if shape.micro_rows > 0 else 0
    return StepMemory(shape, int(m.temp_size_in_bytes), int(m.argument_size_in_bytes) + opt,
                      int(m.output_size_in_bytes), int(m.alias_size_in_bytes), devices,
                      jax.devices()[0].platform == "cpu")


def _bytes_per_device(tree) -> int:
    """Bytes of an abstract pytree per device (a sharded leaf's share; the rest whole)."""
    total = 0
    for x in jax.tree.leaves(tree):
        sh = getattr(x, "sharding", None)
        total += int(np.prod(x.shape if sh is None else sh.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
    return total


def _cgroup_room() -> int | None:
    """Bytes this process's memory cgroup still allows (v2 or v1), None without a limit."""
    for lim, cur in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                     ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(lim) as f:
                raw = f.read().strip()
            if raw == "max" or int(raw) >= 2 ** 60:
                return None
            with open(cur) as f:
                return max(0, int(raw) - int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return None


def host_available_bytes() -> int:
    """Host memory available to this process now: psutil's `available` (or /proc/meminfo's
    MemAvailable, or free pages), capped by the memory cgroup's room."""
    avail = None
    try:
        import psutil  # noqa: PLC0415  (optional: not a dependency)

        avail = int(psutil.virtual_memory().available)
    except ImportError:
        try:
            with open("/proc/meminfo") as f:
                for ln in f:
                    if ln.startswith("MemAvailable:"):
                        avail = int(ln.split()[1]) * 1024
                        break
        except OSError:
            pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    room = _cgroup_room()
    return avail if room is None else min(avail, room)


def available_bytes(c) -> int:
    """What `StepMemory.needed` is compared with: `rl.memory_check.budget_gib` if > 0, else on CPU
    the host's available memory, on an accelerator one device's free memory (its `memory_stats`)."""
    mc = c.rl.memory_check
    if float(mc.budget_gib) > 0:
        return int(float(mc.budget_gib) * GIB)
    dev = jax.devices()[0]
    if dev.platform != "cpu":
        st = dev.memory_stats() or {}
        if "bytes_limit" in st:
            return int(st["bytes_limit"]) - int(st.get("bytes_in_use", 0))
    return host_available_bytes()


def verdict(mem: StepMemory, c, available: int) -> None:
    """Raise the one-line `ConfigError` when `mem.needed` exceeds `rl.memory_check.fraction` of `available`."""
    frac = float(c.rl.memory_check.fraction)
    budget = int(frac * available)
    if mem.needed <= budget:
        return
    remat = bool(c.model.get("remat", False))
    micro = int(c.rl.batch.get("micro_rows", 0) or 0)
    knobs = [f"a smaller rl.batch.micro_rows (now {micro})" if micro else
             "rl.batch.micro_rows > 0 (gradient accumulation: memory scales with it)"]
    if not remat:
        knobs.append("model.remat=True")
    raise ConfigError(
        f"the RL train step needs {mem.needed / GIB:.2f} GiB for its largest batch ({mem.shape.describe()}: "
        f"temporaries {mem.temp / GIB:.2f} GiB, arguments {mem.args / GIB:.2f} GiB"
        + (f", per device x{mem.devices}" if mem.host_shared and mem.devices > 1 else "")
        + f") but {budget / GIB:.2f} GiB is allowed (rl.memory_check.fraction={frac:g} of {available / GIB:.2f} GiB "
        f"available): set {' and/or '.join(knobs)}, or shorten the batch (rl.prompts_per_step, rl.group_size, "
        f"agent.max_context_tokens); rl.memory_check.enabled=False skips this check "
        f"(benchmarks/rl_step_memory.py measures settings)")


def check_step_memory(c, *, available: int | None = None) -> StepMemory | None:
    """`rl.memory_check`: the step's memory for the run's largest batch (`step_memory`) against
    the allowed share of `available` (default `available_bytes(c)`); raises `ConfigError` (one
    line) if it does not fit. Returns the measurement, or None when the check is off."""
    mc = c.rl.get("memory_check")
    if mc is None or not bool(mc.enabled):
        return None
    mem = step_memory(c)
    verdict(mem, c, available if available is not None else available_bytes(c))
    return mem


def preflight(c, *, prog: str) -> StepMemory | None:
    """A driver's `rl.memory_check` before any sandbox, warm start or eval (experiments/rl.py,
    experiments/selfsum.py): `check_step_memory`, its line printed; a step that cannot fit stops the
    driver with the one-line error and exit code 2 (`cli.fail`)."""
    t0 = time.time()
    try:
        mem = check_step_memory(c)
    except ConfigError as e:
        cli.fail(str(e), prog=prog)
    if mem is None:                       # rl.memory_check off
        return None
    print(f"memory check: the train step needs {mem.needed / GIB:.2f} GiB for its largest batch "
          f"({mem.line()}; {time.time() - t0:.0f}s)", flush=True)
    return mem


def memory_mappings() -> tuple[int, int] | None:
    """(memory mappings this process holds, the kernel's `vm.max_map_count`); None where /proc lacks them."""
    try:
        with open("/proc/self/maps", "rb") as fh:
            held = sum(1 for _ in fh)
        with open("/proc/sys/vm/max_map_count") as fh:
            return held, int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def release_compiled_if_near_limit(c, *, tag: str = "") -> bool:
    """`jax.clear_caches()` when the process holds more than `rl.memory_check.mappings_fraction` of
    `vm.max_map_count` (module docstring); prints the counts before and after. True when it released.
    The next run compiles again (tens of seconds) instead of the process dying at the limit."""
    import gc  # noqa: PLC0415

    frac = float(c.rl.memory_check.get("mappings_fraction", 0.5))
    now = memory_mappings()
    if now is None or now[0] <= frac * now[1]:
        return False
    jax.clear_caches()
    gc.collect()
    after = memory_mappings()
    print(f"{tag}{now[0]} memory mappings of vm.max_map_count {now[1]} (> {frac:.0%}): compiled executables "
          f"released, {after[0] if after else '?'} left (the next run compiles again)", flush=True)
    return True
