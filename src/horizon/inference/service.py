"""The rollout engine behind a thread, for callers on any thread: the OpenAI-compatible server
(`inference.server`) and its tests (docs/SERVING.md).

One thread owns the engine (`replicas.make_engine`: continuous batching, prefix reuse, in-flight
weight swaps); callers hand it `Request`s with a completion callback and, for a streamed request,
a progress callback that sees the tokens drawn so far after every engine round-trip. `load` swaps
the weights; the engine picks them up at its next round-trip, as it does in an RL run (requests in
flight finish on the cache they have, `rl.sampler.kv_mode`), and no later request reuses a cache
the old weights computed. Weight versions are the caller's labels (a checkpoint's step, an RL
run's version); the engine runs on a load counter of its own, so loading a version number the
service already reported still swaps the weights. A bad request
fails alone (its callback gets the engine's `ValueError`); an engine error fails the requests in
flight, is counted, and the engine is rebuilt, so the service outlives both.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np

from horizon.inference import warmup
from horizon.inference.engine import Completion, Request
from horizon.inference.replicas import make_engine

Done = Callable[[Completion | BaseException], None]
Progress = Callable[[list, list], None]        # (tokens so far, their log-probs)


@dataclasses.dataclass
class Ticket:
    request: Request
    done: Done
    progress: Progress | None = None


def _settle(fut: concurrent.futures.Future, res) -> None:
    if isinstance(res, BaseException):
        fut.set_exception(res)
    else:
        fut.set_result(res)


class EngineService:
    """`make_engine(cfg, poll=...)` run by one daemon thread; `cfg` is the full config (model +
    `rl.sampler`), `overrides` go to the engine as in `EnginePolicy`. `warm`: compile the engine's
    whole plan first (`inference.warmup`; `on_warm()` after each call), so no request waits on a
    compile and the process's memory holds every executable from the start."""

    def __init__(self, cfg, params, *, version: int = 0, warm: bool = False, on_warm=None, **overrides):
        self._weights = (params, 0)                     # (params, load counter): what the engine polls
        self._labels = {0: int(version)}                # load counter -> the caller's version
        self._fresh = False                             # a load the engine thread has not seen yet
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._queue: collections.deque[Ticket] = collections.deque()
        self._make = lambda: make_engine(cfg, poll=self._poll, **overrides)
        self.engine = self._make()
        if warm:                  # every shape the engine can call compiled before the first request
            warmup.warm_up(self.engine, on_call=on_warm)
        self.stats: collections.Counter = collections.Counter()
        self._tickets: dict[int, Ticket] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="engine-service", daemon=True)
        self._thread.start()

    # -- callers ---------------------------------------------------------------------------------
    def _poll(self) -> tuple[dict, int]:
        with self._lock:
            return self._weights

    @property
    def version(self) -> int:
        """The weight version served now (the caller's label)."""
        with self._lock:
            return self._labels[self._weights[1]]

    def load(self, params, version: int) -> None:
        """Serve `params` as weight `version` from the engine's next round-trip on."""
        with self._lock:
            n = self._weights[1] + 1
            self._weights, self._labels[n], self._fresh = (params, n), int(version), True
        with self._cv:
            self._cv.notify()

    def _labelled(self, c: Completion) -> Completion:
        with self._lock:
            return dataclasses.replace(c, versions=np.asarray([self._labels[int(v)] for v in c.versions], np.int32))

    def submit(self, request: Request, done: Done, progress: Progress | None = None) -> None:
        """Queue `request`; `done(completion or exception)` runs on the engine thread when it ends."""
        self.submit_many([(request, done, progress)])

    def submit_many(self, items: Sequence[tuple[Request, Done, Progress | None]]) -> None:
        """Queue several requests at once: the engine admits them in one round, as it admits the
        turns an in-process policy submits together (identical contexts prefilled once)."""
        with self._cv:
            if self._closed:
                raise RuntimeError("the engine service is closed")
            self._queue.extend(Ticket(*it) for it in items)
            self._cv.notify()

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Submit `requests` and wait for them: their completions in order (an error re-raised)."""
        futs = [concurrent.futures.Future() for _ in requests]
        self.submit_many([(r, functools.partial(_settle, f), None) for r, f in zip(requests, futs)])
        return [f.result() for f in futs]

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=30)

    # -- the engine thread -----------------------------------------------------------------------
    def _take(self) -> list[Ticket] | None:
        with self._cv:
            while not self._queue and not self.engine.busy and not self._closed:
                self._cv.wait()
            if self._closed:
                return None
            out = list(self._queue)
            self._queue.clear()
            return out

    def _run(self) -> None:
        while (new := self._take()) is not None:
            for t in new:
                try:
                    self._tickets[self.engine.submit(t.request)] = t
                except Exception as e:      # a request the engine refuses fails alone
                    self.stats["refused"] += 1
                    t.done(e)
            with self._lock:
                fresh, self._fresh = self._fresh, False
            if fresh:
                self.engine.drop_idle()     # the next round-trip switches: no cache of the old weights is reused
            if not self.engine.busy:
                continue
            try:
                finished = self.engine.step()
            except Exception as e:          # the engine broke: fail what it held, start a fresh one
                self.stats["engine_errors"] += 1
                print(f"[serve] engine error, {len(self._tickets)} request(s) failed, engine rebuilt: "
                      f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
                for t in self._tickets.values():
                    t.done(e)
                self._tickets.clear()
                self.engine = self._make()
                continue
            streaming = {rid: t for rid, t in self._tickets.items() if t.progress is not None}
            if streaming:
                for rid, (toks, lps) in self.engine.in_flight().items():
                    if rid in streaming:
                        streaming[rid].progress(list(toks), list(lps))
            for c in finished:
                self.stats["completed"] += 1
                self._tickets.pop(c.request_id).done(self._labelled(c))
