"""The rollout engine's host-side slot bookkeeping (docs/SPEC.md §4): which request takes which cache row,
which cached prefix it reuses, and the park store of swapped-out episode caches.

Plain host code over token arrays, apart from `engine.Engine`, so the queue policy (FIFO, nothing
preempted, least recently used slots evicted first) and prefix reuse (longest common prefix;
identical contexts of one round prefilled once) read and test on their own. An admission round
returns a plan (`Admission`); the engine runs the device steps it asks for.
Design: docs/INFERENCE.md ("Budget policy", "Reuse").
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

Extract = Callable[[int, int], Any]     # (slot, length) -> that slot's first `length` cache positions


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:          # the usual miss, without building the comparison arrays
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


@dataclasses.dataclass
class Seq:
    """An admitted request's host record: `req` (an `engine.Request`), its context, key bits and
    stop table, what it generated so far and its prefill (tokens computed / reused)."""

    rid: int
    req: Any
    ctx: np.ndarray
    key_data: np.ndarray
    stops: np.ndarray
    toks: list = dataclasses.field(default_factory=list)
    lps: list = dataclasses.field(default_factory=list)
    ris: list = dataclasses.field(default_factory=list)      # [L_moe, k] per generated token
    vers: list = dataclasses.field(default_factory=list)
    prefill: int = 0
    reused: int = 0


@dataclasses.dataclass
class Slot:
    """One cache row: *active* (`seq` set), *parked* (an `owner`'s cache between its turns) or free."""

    tokens: np.ndarray                   # ids whose latents the row holds at positions 0..len-1
    owner: Hashable | None = None
    seq: Seq | None = None               # the active request
    used: int = 0                        # LRU clock


@dataclasses.dataclass
class Job:
    """A prefill: `tokens` go to positions start.. of `slot`; `followers` copy the result."""

    seq: Seq
    slot: int
    tokens: np.ndarray
    start: int
    index: int = 0                       # generated-token number the logits draw (recompute: m)
    followers: list = dataclasses.field(default_factory=list)   # (seq, slot)
    want_ri: bool = False
    ri: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Admission:
    """One admission round's plan, run in this order (a source slot may be a later target): prefix
    `copies` between slots, park-store swap-ins (`inserts`), prefill `jobs` (leaders of identical
    contexts, whose followers copy the leader's cache afterwards)."""

    copies: list = dataclasses.field(default_factory=list)    # (src slot, dst slot, prefix length)
    inserts: list = dataclasses.field(default_factory=list)   # (slot, saved rows)
    jobs: list = dataclasses.field(default_factory=list)      # Job


class SlotTable:
    """The slots, their LRU clock and the park store (owner -> (tokens, saved cache rows), at most
    `park_tokens` positions in all, least recently parked dropped first). `stats` is the engine's
    counter (evictions, store drops, reused tokens)."""

    def __init__(self, slots: int, park_tokens: int, min_reuse: int, stats: collections.Counter):
        self.slots = [Slot(np.zeros(0, np.int32)) for _ in range(slots)]
        self.store: collections.OrderedDict = collections.OrderedDict()
        self.park_tokens, self.min_reuse, self.stats = park_tokens, min_reuse, stats
        self._clock = 0

    def tick(self) -> int:
        self._clock += 1
        return self._clock

    @property
    def active(self) -> bool:
        """Some slot decodes a request."""
        return any(s.seq is not None for s in self.slots)

    def in_flight(self, owner: Hashable) -> bool:
        return any(s.owner == owner and s.seq is not None for s in self.slots)

    def finish(self, i: int) -> Seq:
        """Slot `i`'s request ended: the slot stays parked (its owner's) or free, its tokens a prefix."""
        s = self.slots[i]
        seq, s.seq, s.used = s.seq, None, self.tick()
        return seq

    def release(self, owner: Hashable) -> None:
        """Forget `owner`'s cache: its parked slot becomes free (its tokens stay a reusable prefix)."""
        for s in self.slots:
            if s.owner == owner and s.seq is None:
                s.owner = None
        self.store.pop(owner, None)

    def drop_idle(self) -> None:
        """Forget every cache no request is decoding (the park store, parked and free slots)."""
        self.store.clear()
        for s in self.slots:
            if s.seq is None:
                s.tokens, s.owner = np.zeros(0, np.int32), None

    def pick(self, owner: Hashable | None, taken: set, extract: Extract) -> int | None:
        """The slot a request of `owner` takes, or None (it waits): its owner's parked slot, else the
        least recently used free slot, else the least recently used parked slot, swapped out first."""
        idle = [i for i, s in enumerate(self.slots) if s.seq is None and i not in taken]
        mine = [i for i in idle if owner is not None and self.slots[i].owner == owner]
        if mine:
            return mine[0]
        free = [i for i in idle if self.slots[i].owner is None]
        if free:
            return min(free, key=lambda i: self.slots[i].used)
        if idle:
            victim = min(idle, key=lambda i: self.slots[i].used)
            self._swap_out(victim, extract)
            return victim
        return None

    def _swap_out(self, i: int, extract: Extract) -> None:
        s = self.slots[i]
        n = len(s.tokens)
        self.stats["evictions"] += 1
        if 0 < n <= self.park_tokens:
            while self.store and sum(len(t) for t, _ in self.store.values()) + n > self.park_tokens:
                self.store.popitem(last=False)
                self.stats["store_drops"] += 1
            self.store[s.owner] = (s.tokens, extract(i, n))
        s.owner, s.tokens = None, np.zeros(0, np.int32)

    def best_source(self, ctx: np.ndarray, target: int, taken: set) -> tuple[str, Any, int]:
        """(kind, where, lcp) of the cache sharing the longest prefix with `ctx`: ("slot", i) among
        slots not assigned this round (the target's own included), or ("store", owner)."""
        best = ("none", None, 0)
        for i, s in enumerate(self.slots):
            if (i in taken and i != target) or len(s.tokens) == 0:
                continue
            n = common_prefix(s.tokens, ctx)
            if n > best[2] or (n == best[2] and n > 0 and i == target):
                best = ("slot", i, n)
        for owner, (toks, _) in self.store.items():
            n = common_prefix(toks, ctx)
            if n > best[2]:
                best = ("store", owner, n)
        return best

    def admit(self, waiting: collections.deque, extract: Extract) -> Admission:
        """Assign `waiting` requests (`Seq`s) to slots in order until one must wait, and plan each
        one's reuse: an identical context of this round follows its leader (0 prefill tokens), any
        other prefills what no cache holds (`_plan_reuse`)."""
        plan, taken, leaders = Admission(), set(), {}
        while waiting:
            seq = waiting[0]
            i = self.pick(seq.req.owner, taken, extract)
            if i is None:
                break
            waiting.popleft()
            taken.add(i)
            slot = self.slots[i]
            slot.owner, slot.seq, slot.used = seq.req.owner, seq, self.tick()
            key = seq.ctx.tobytes()
            if key in leaders:                                      # identical context this round
                leaders[key].followers.append((seq, i))
                slot.tokens = seq.ctx
                seq.reused = len(seq.ctx)
                self.stats["reused_tokens"] += seq.reused
                continue
            lcp = self._plan_reuse(plan, seq, i, taken)
            seq.reused = lcp
            self.stats["reused_tokens"] += lcp
            slot.tokens = seq.ctx
            job = Job(seq, i, seq.ctx[lcp:], lcp)
            plan.jobs.append(job)
            leaders[key] = job
        return plan

    def _plan_reuse(self, plan: Admission, seq: Seq, i: int, taken: set) -> int:
        """The prefix of `seq`'s context that slot `i` will hold before its prefill (0: none), and
        the copy or swap-in that puts it there. >= 1 token is always prefilled (its logits draw); a
        hit elsewhere shorter than `min_reuse` is prefilled instead (a copy of a few tokens saves
        nothing and each copy shape is one more compile)."""
        kind, where, lcp = self.best_source(seq.ctx, i, taken)
        lcp = min(lcp, len(seq.ctx) - 1)
        if lcp < self.min_reuse and not (kind == "slot" and where == i):
            lcp = 0
        if lcp > 0 and kind == "slot" and where != i:
            plan.copies.append((where, i, lcp))
        elif lcp > 0 and kind == "store":
            plan.inserts.append((i, self.store[where][1]))
            if where == seq.req.owner:
                self.store.pop(where)
        return lcp
