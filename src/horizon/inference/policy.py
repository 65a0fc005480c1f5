"""The policy interface the agent samples through, and the rollout engine behind it.

A policy maps contexts to `Generation`s: ``policy(contexts, max_new)`` (batched) and, for engines,
``policy.stream()``, through which `horizon.agent.run_episodes` advances episodes independently.
`rollout_policy` is every caller's factory (docs/INFERENCE.md, "Who uses it").
"""

from __future__ import annotations

import collections
import os
import threading
import time

import jax
import numpy as np

from horizon.inference import sampler
from horizon.inference.config import EngineConfig, pop_engine_fields
from horizon.inference.engine import Completion, Request, generate_requests
from horizon.inference.generation import Generation, Policy
from horizon.inference.remote import ADMIN_TOKEN_ENV, RemotePolicy
from horizon.inference.replicas import make_engine

__all__ = ["EnginePolicy", "EngineStream", "Generation", "Policy", "StreamWrapper", "rollout_policy"]


class EngineStream:
    """One `run_episodes` call's view of an `EnginePolicy` (the interface `horizon.agent.run_episodes`
    drives episodes through independently): `submit(episode, context, max_new)` queues an episode's
    turn (owner = the episode: its cache persists between turns), `advance()` runs one engine
    round-trip and returns the ``(episode, Generation)`` pairs that finished, `release(episode)` drops
    a finished episode's cache. Turn t of episode e draws with key ``fold_in(fold_in(stream key, e), t)``,
    so an episode's samples do not depend on the timing of the others."""

    def __init__(self, policy: EnginePolicy, key: jax.Array):
        self.policy, self.key = policy, key
        self.session = policy._new_session()
        self.turns: dict[int, int] = collections.Counter()
        self.by_rid: dict[int, int] = {}

    def submit(self, episode: int, context: np.ndarray, max_new_tokens: int) -> None:
        key = jax.random.fold_in(jax.random.fold_in(self.key, int(episode)), self.turns[episode])
        self.turns[episode] += 1
        rid = self.policy.engine.submit(self.policy._request(context, key, max_new_tokens,
                                                             owner=(self.session, int(episode))))
        self.by_rid[rid] = (int(episode), self.turns[episode] - 1)

    def advance(self) -> list:
        out = []
        t0 = time.perf_counter()
        done = self.policy.engine.step()
        self.policy.state["gen_s"] += time.perf_counter() - t0
        for c in done:
            episode, turn = self.by_rid.pop(c.request_id)
            out.append((episode, self.policy._generation(c, episode=episode, turn=turn)))
        return out

    def release(self, episode: int) -> None:
        self.policy.engine.release((self.session, int(episode)))

    def idle(self, seconds: float) -> None:
        """The driver waited `seconds` with nothing for the engine to do: every unfinished episode
        was in a tool call (`EnginePolicy.usage`'s ``tool_wait_s``)."""
        self.policy.state["tool_wait_s"] += float(seconds)

    @property
    def busy(self) -> bool:
        return bool(self.by_rid)


class StreamWrapper:
    """An engine stream that forwards every call to `inner`: the base of wrappers that change one or
    two calls (the eval harness's clock, the oracle-summary policy of the self-summarization study)."""

    def __init__(self, inner):
        self.inner = inner

    def submit(self, episode: int, context: np.ndarray, max_new_tokens: int) -> None:
        self.inner.submit(episode, context, max_new_tokens)

    def advance(self) -> list:
        return self.inner.advance()

    def release(self, episode: int) -> None:
        self.inner.release(episode)

    def idle(self, seconds: float) -> None:
        self.inner.idle(seconds)

    @property
    def busy(self) -> bool:
        return self.inner.busy


class EnginePolicy:
    """The engine as the agent's policy (horizon.agent).

    `params_ref` is a `sampler.ParamsHolder` or a ``poll() -> (params, version)`` function; the
    engine polls it at every host round-trip (<= `chunk_tokens` decode steps), so a swap takes
    effect mid-generation (per-token versions, `kv_mode`). `cfg` is the full config (model +
    `rl.sampler`); `overrides` replace `EngineConfig` fields or `sampler.SamplerConfig` fields (of
    which the engine takes temperature, top_p, stop_tokens). ``policy(contexts, max_new)`` consumes
    a fresh split of `key` per call and gives row i the key ``fold_in(split, i)``, as `generate` does
    (`sampler.sequence_keys`), hence the same samples; ``policy.stream()`` (a fresh split) is the
    independent-episode interface. `state` counts switches, generated tokens, prefill tokens
    computed / reused and seconds in engine calls (`gen_s`: tool calls that overlap decoding are not
    in it).
    """

    def __init__(self, params_ref, cfg, key: jax.Array, *, chunk_tokens: int = 0, kv_mode: str | None = None,
                 engine: EngineConfig | None = None, **overrides):
        eng = pop_engine_fields(overrides)
        if "rl" in cfg and "sampler" in cfg.rl:
            sc = sampler.sampler_config(cfg, **overrides)
        else:
            sc = sampler.SamplerConfig(**overrides)
        self.temperature, self.top_p = float(sc.temperature), float(sc.top_p)
        if chunk_tokens:
            eng["sync_tokens"] = int(chunk_tokens)
        if kv_mode is not None:
            eng["kv_mode"] = kv_mode
        poll = params_ref.get if isinstance(params_ref, sampler.ParamsHolder) else params_ref
        self.engine = make_engine(cfg, poll=poll, engine=engine, stop_tokens=sc.stop_tokens, **eng)
        self.params_ref = params_ref
        self._lock = threading.Lock()
        self._sessions = 0
        self.state = {"key": key, "switches": 0, "tokens": 0, "prefill_tokens": 0, "reused_tokens": 0,
                      "gen_s": 0.0, "tool_wait_s": 0.0}
        self.log: list[dict] = []     # per generation: episode, turn, context / prefill / reused / generated tokens

    def _split(self) -> jax.Array:
        with self._lock:
            self.state["key"], sub = jax.random.split(self.state["key"])
        return sub

    def _new_session(self) -> int:
        with self._lock:
            self._sessions += 1
            return self._sessions

    def _request(self, context, key, max_new: int, owner=None) -> Request:
        return Request(np.asarray(context, np.int32), key, int(max_new), None, self.temperature, self.top_p, owner)

    def _generation(self, c: Completion, episode: int | None = None, turn: int | None = None):
        self.log.append(dict(episode=episode, turn=turn, context_tokens=c.prefill_tokens + c.reused_tokens,
                             prefill_tokens=c.prefill_tokens, reused_tokens=c.reused_tokens,
                             generated_tokens=len(c.tokens)))
        self.state["tokens"] += len(c.tokens)
        self.state["prefill_tokens"] += c.prefill_tokens
        self.state["reused_tokens"] += c.reused_tokens
        self.state["switches"] = int(self.engine.stats["switches"])
        return Generation(tokens=c.tokens, logprobs=c.logprobs, router_indices=c.router_indices,
                          policy_version=c.versions)

    def __call__(self, contexts: list, max_new_tokens: int) -> list:
        sub = self._split()
        keys = sampler.sequence_keys(sub, len(contexts))
        reqs = [self._request(ctx, keys[i], max_new_tokens) for i, ctx in enumerate(contexts)]
        t0 = time.perf_counter()
        done = generate_requests(self.engine, reqs)
        self.state["gen_s"] += time.perf_counter() - t0
        return [self._generation(c) for c in done]

    def usage(self) -> dict:
        """Where this policy's time went (docs/PERF.md, "Studies at benchmark speed"): seconds in engine
        calls (`gen_s`), seconds the driver waited with the engine idle because every open episode was
        in a tool (`tool_wait_s`), the decode chunks' slot-steps (`slot_steps`) and the tokens generated
        (`engine_tokens`); occupancy is their ratio (`horizon.rl.runtime.steptime`)."""
        return dict(gen_s=float(self.state["gen_s"]), tool_wait_s=float(self.state["tool_wait_s"]),
                    slot_steps=int(self.engine.stats["slot_steps"]), engine_tokens=int(self.state["tokens"]))

    def stream(self) -> EngineStream:
        """A fresh stream (its own key split) for one `run_episodes` call."""
        return EngineStream(self, self._split())


def rollout_policy(params_ref, cfg, key: jax.Array, *, chunk_tokens: int = 0, kv_mode: str | None = None,
                   push=None, **overrides):
    """The agent policy every caller samples with (docs/SPEC.md §4, §4.1, §7): an `EnginePolicy` for the RL
    loops' group rollouts (`rl.runtime.core.rollout_groups`, sync and async workers), the held-out eval
    (`rl.runtime.loop.evaluate`) and the eval harness (`eval.harness.policy_from_params`), on one
    device or sharded over the config's mesh (docs/INFERENCE.md, "Mesh"). `params_ref` is a
    `sampler.ParamsHolder` or ``poll() -> (params, version)``, polled at every engine round-trip
    (<= `chunk_tokens` decode steps); an episode's samples depend on its own key only; the policy
    counts ``state["switches"]``, ``state["tokens"]`` and ``state["gen_s"]`` (seconds in engine calls).
    `cfg` needs the `rl.sampler` section (the engine's sizes, configs/rl_tiny.py). With
    ``rl.sampler.backend = "remote"`` the same interface over an OpenAI-compatible endpoint
    (`remote.RemotePolicy`; `push(params, version)` publishes a new weight version for it)."""
    s = cfg.rl.sampler if "rl" in cfg and "sampler" in cfg.rl else {}
    if str(s.get("backend", "engine")) == "remote":
        sc = sampler.sampler_config(cfg, **overrides)
        return RemotePolicy(str(s.base_url), key, model=str(s.get("remote_model", "")),
                            temperature=float(sc.temperature), top_p=float(sc.top_p), params_ref=params_ref, push=push,
                            admin_token=os.environ.get(ADMIN_TOKEN_ENV, ""),
                            expert_ids=bool(s.get("remote_expert_ids", True)),
                            concurrency=int(s.get("remote_concurrency", 64)),
                            timeout_s=float(s.get("remote_timeout_s", 600.0)), retries=int(s.get("remote_retries", 4)))
    return EnginePolicy(params_ref, cfg, key, chunk_tokens=chunk_tokens, kv_mode=kv_mode, **overrides)
