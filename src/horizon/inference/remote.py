"""A policy served by any OpenAI-compatible endpoint (`rl.sampler.backend = "remote"`; docs/SERVING.md).

`RemotePolicy` has the interface of `policy.EnginePolicy` — ``policy(contexts, max_new)`` and
``policy.stream()`` — so the agent, the eval harness and the RL rollouts use it unchanged. Each turn
is one ``POST /v1/completions`` whose prompt is the context's token ids (built by `model.tokenizer`,
never chat messages, so nothing is re-tokenized) and whose `seed` is the turn's key
(`openai_api.key_seed`): the key an `EnginePolicy` would draw the turn with, so against horizon's
server a remote run samples what an in-process one does. Tokens, log-probs, per-token weight
versions and (where the server returns them) expert ids come back into the same `Generation`.

Weights: with `params_ref` the policy polls ``(params, version)`` before each batch and stream, and
a new version goes out through `push(params, version)` (the RL loop publishes it to its weight
store and calls `load`, the server's ``/admin/load``). Failures: a connection error or a 5xx is
retried (`retries`, doubling waits), then `RemoteBackendError`; a 4xx is the request's fault and
raised at once; a response without token ids or log-probs is refused (`RemoteBackendError`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable

import httpx
import jax
import numpy as np

from horizon.inference import openai_api as api
from horizon.inference import sampler
from horizon.inference.generation import Generation

Push = Callable[[dict, int], None]
ADMIN_TOKEN_ENV = "HORIZON_ADMIN_TOKEN"   # the bearer token of a server's /admin/load (serve.admin_token)


class RemoteBackendError(RuntimeError):
    """The endpoint failed (after retries) or cannot drive RL (no token ids or log-probs)."""


def generation_of(choice: dict, version: int) -> Generation:
    """A completion choice as a `Generation` (tokens from ``horizon_token_ids`` or vLLM's
    ``token_id:N`` strings; log-probs of the sampled tokens; expert ids [L_moe, m, k] if present)."""
    lp = choice.get("logprobs") or {}
    ids = choice.get("horizon_token_ids")
    if ids is None and lp.get("tokens") and all(str(t).startswith("token_id:") for t in lp["tokens"]):
        ids = [int(str(t).split(":", 1)[1]) for t in lp["tokens"]]
    if ids is None or lp.get("token_logprobs") is None:
        raise RemoteBackendError("the endpoint returned no token ids or no log-probs; RL and horizon's agent need "
                                 "both (vLLM: --return-tokens-as-token-ids and logprobs=1; docs/SERVING.md)")
    lps = np.asarray([0.0 if x is None else x for x in lp["token_logprobs"]], np.float32)
    ex = choice.get("horizon_expert_ids")
    ri = None if ex is None else np.transpose(np.asarray(ex, np.int32).reshape(len(ids), -1, np.shape(ex)[-1]),
                                              (1, 0, 2))
    vers = choice.get("horizon_weight_versions")
    return Generation(tokens=np.asarray(ids, np.int32), logprobs=lps, router_indices=ri,
                      policy_version=np.asarray(vers, np.int32) if vers is not None else int(version))


class RemotePolicy:
    """`EnginePolicy`'s interface over an OpenAI-compatible `base_url` (module docstring)."""

    def __init__(self, base_url: str, key: jax.Array, *, model: str = "", temperature: float = 1.0,
                 top_p: float = 1.0, params_ref=None, push: Push | None = None, admin_token: str = "",
                 expert_ids: bool = False, concurrency: int = 64, timeout_s: float = 600.0, retries: int = 4):
        self.base_url = base_url.rstrip("/")                  # the API root, e.g. http://host:8000/v1
        self.root = self.base_url.removesuffix("/v1")          # horizon's /admin routes sit beside /v1
        self.model, self.temperature, self.top_p = model, float(temperature), float(top_p)
        poll = params_ref.get if isinstance(params_ref, sampler.ParamsHolder) else params_ref
        self._poll, self._push, self.admin_token = poll, push, admin_token
        self.expert_ids, self.retries = bool(expert_ids), int(retries)
        self.http, self.pool = _connection(self.base_url, int(concurrency), float(timeout_s))
        self._lock = threading.Lock()
        self.version = None
        self.state = {"key": key, "switches": 0, "tokens": 0, "prefill_tokens": 0, "reused_tokens": 0,
                      "gen_s": 0.0, "tool_wait_s": 0.0, "retries": 0}

    # -- weights ---------------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """Poll the weights; a new version is published by `push` and loaded by the server (`load`).
        Without `push` the first version is taken as the server's and a later one is an error."""
        if self._poll is None:
            return
        params, version = self._poll()
        if self.version == int(version):
            return
        if self._push is None:
            if self.version is None:
                self.version = int(version)
                return
            raise RemoteBackendError(f"the weights moved to version {version} and this remote policy has no push "
                                     "hook to send them (an RL run builds one: rl.runtime.remote)")
        self._push(params, int(version))
        self.load(int(version))
        if self.version is not None:
            self.state["switches"] += 1
        self.version = int(version)

    def load(self, version: int) -> dict:
        """Ask the server to serve published weight `version` (``POST /admin/load``)."""
        auth = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        return self._post(f"{self.root}/admin/load", {"version": int(version)}, headers=auth)

    # -- requests --------------------------------------------------------------------------------
    def _post(self, url: str, body: dict, headers: dict | None = None) -> dict:
        wait = 0.5
        for attempt in range(self.retries + 1):
            try:
                r = self.http.post(url, json=body, headers=headers)
            except httpx.TransportError as e:
                err = f"{type(e).__name__}: {e}"
            else:
                if r.status_code < 400:
                    return r.json()
                if r.status_code < 500:
                    raise ValueError(f"{url} refused the request ({r.status_code}): {r.text[:300]}")
                err = f"HTTP {r.status_code}: {r.text[:300]}"
            if attempt < self.retries:
                self.state["retries"] += 1
                time.sleep(wait)
                wait *= 2
        raise RemoteBackendError(f"{url} failed {self.retries + 1} times; last: {err}")

    def generate(self, contexts: list, keys: list, max_new: int) -> list[Generation]:
        """One request for several turns (each its own key, ``horizon_seeds``), so the server's engine
        admits them together as an in-process engine admits turns submitted together."""
        body = {"prompt": [[int(t) for t in np.asarray(c).reshape(-1)] for c in contexts], "max_tokens": int(max_new),
                "temperature": self.temperature, "top_p": self.top_p, "logprobs": 1,
                "horizon_seeds": [api.key_seed(np.asarray(jax.random.key_data(k))) for k in keys],
                "return_tokens_as_token_ids": True, "return_expert_ids": self.expert_ids}
        if len(contexts) == 1:
            body["seed"] = body["horizon_seeds"][0]     # what an endpoint without horizon's extension reads
        if self.model:
            body["model"] = self.model
        t0 = time.perf_counter()
        choices = sorted(self._post(f"{self.base_url}/completions", body)["choices"], key=lambda ch: ch["index"])
        gens = [generation_of(ch, self.version or 0) for ch in choices]
        with self._lock:
            self.state["gen_s"] += time.perf_counter() - t0
            self.state["tokens"] += sum(len(g.tokens) for g in gens)
            self.state["prefill_tokens"] += sum(len(p) for p in body["prompt"])
        return gens

    def _split(self) -> jax.Array:
        with self._lock:
            self.state["key"], sub = jax.random.split(self.state["key"])
        return sub

    def __call__(self, contexts: list, max_new_tokens: int) -> list:
        self.sync_weights()
        keys = sampler.sequence_keys(self._split(), len(contexts))
        return self.generate(list(contexts), [keys[i] for i in range(len(contexts))], max_new_tokens)

    def stream(self) -> RemoteStream:
        self.sync_weights()
        return RemoteStream(self, self._split())

    def usage(self) -> dict:
        """`EnginePolicy.usage`'s keys; the server's slot-steps are not visible here (0)."""
        return dict(gen_s=float(self.state["gen_s"]), tool_wait_s=float(self.state["tool_wait_s"]),
                    slot_steps=0, engine_tokens=int(self.state["tokens"]))



@functools.cache
def _connection(base_url: str, concurrency: int, timeout_s: float):
    """One HTTP client and request pool per endpoint, shared by every policy of the process (an RL run
    builds a policy per generation batch; each its own pool would leave threads behind)."""
    return (httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency)),
            concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="remote-policy"))


class RemoteStream:
    """`policy.EngineStream`'s interface: turn t of episode e draws with ``fold_in(fold_in(key, e), t)``.
    Turns submitted between two `advance` calls go out as one request per `max_new` (the server
    admits them together); `advance` returns the turns of requests that finished (waiting briefly
    when none has)."""

    POLL_S = 0.01

    def __init__(self, policy: RemotePolicy, key: jax.Array):
        self.policy, self.key = policy, key
        self.turns: dict[int, int] = {}
        self.queued: list[tuple[int, np.ndarray, jax.Array, int]] = []
        self.pending: dict[concurrent.futures.Future, list[int]] = {}

    def submit(self, episode: int, context: np.ndarray, max_new_tokens: int) -> None:
        t = self.turns.get(episode, 0)
        self.turns[episode] = t + 1
        key = jax.random.fold_in(jax.random.fold_in(self.key, int(episode)), t)
        self.queued.append((int(episode), context, key, int(max_new_tokens)))

    def _flush(self) -> None:
        by_len: dict[int, list] = {}
        for item in self.queued:
            by_len.setdefault(item[3], []).append(item)
        self.queued = []
        for max_new, items in by_len.items():
            ctxs, keys = [c for _, c, _, _ in items], [k for _, _, k, _ in items]
            fut = self.policy.pool.submit(self.policy.generate, ctxs, keys, max_new)
            self.pending[fut] = [e for e, _, _, _ in items]

    def advance(self) -> list:
        self._flush()
        done, _ = concurrent.futures.wait(list(self.pending), timeout=self.POLL_S,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        return [(e, g) for f in done for e, g in zip(self.pending.pop(f), f.result())]

    def release(self, episode: int) -> None:
        """Nothing to free: the server keeps finished contexts as reusable prefixes of its own."""

    def idle(self, seconds: float) -> None:
        self.policy.state["tool_wait_s"] += float(seconds)

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.queued)
