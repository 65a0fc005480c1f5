"""The OpenAI-compatible wire format of horizon's engine (docs/SERVING.md): request parsing with
one-line 4xx errors, seeds as keys, and response / stream-chunk bodies. Pure functions over dicts,
so the server (`inference.server`) and the remote policy (`inference.remote`) read the same rules.

What horizon adds or changes, all documented in docs/SERVING.md:
- a prompt may be token ids (as vLLM accepts); `return_tokens_as_token_ids` renders tokens as
  ``token_id:N`` (vLLM's spelling); `return_expert_ids` adds ``horizon_expert_ids`` (each generated
  token's routed experts, [moe_layers][k]) and every choice carries ``horizon_token_ids`` and
  ``horizon_weight_versions`` (the weight version that drew each token);
- `seed` is the sampling key itself: choice c of a request draws with the threefry key whose two
  words are ``(seed + c) >> 32`` and ``(seed + c) & 0xffffffff`` (``jax.random.PRNGKey(s)`` for
  s < 2**32), so a client holding a key sends it exactly (`key_seed`); ``horizon_seeds`` gives
  every choice its own (a batch of prompts, each with its key, admitted to the engine together);
- log-probs are the engine's: of the sampled token, untempered; ``top_logprobs`` are not computed
  (null for completions, an empty list per token for chat).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

SEED_LIMIT = 1 << 64
ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "observation"}


class ApiError(Exception):
    """A request the server refuses: HTTP `status` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = int(status), message, param, kind

    @classmethod
    def server(cls, e: BaseException) -> ApiError:
        """The 500 of an exception the server raised itself (not the request's fault)."""
        return cls(500, f"{type(e).__name__}: {e}", kind="server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclasses.dataclass(frozen=True)
class Sampling:
    """One parsed request: its prompts (token ids), how many choices per prompt and how to sample them."""

    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int
    temperature: float
    top_p: float
    n: int
    seed: int | None
    seeds: tuple[int, ...] | None       # horizon_seeds: one per choice (overrides `seed`)
    logprobs: bool
    stream: bool
    token_ids_as_text: bool
    expert_ids: bool
    chat: bool


def _bad(msg: str, param: str) -> ApiError:
    return ApiError(400, msg, param)


def _number(body: dict, name: str, default, lo: float, hi: float, *, integer: bool = False):
    v = body.get(name, default)
    if v is None:
        v = default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not (lo <= v <= hi) or (not integer and not math.isfinite(v)):
        kind = "an integer" if integer else "a number"
        raise _bad(f"'{name}' must be {kind} in [{lo}, {hi}], got {v!r}", name)
    return v


def _flag(body: dict, name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(f"'{name}' must be true or false, got {v!r}", name)
    return v


def _ids(x, vocab: int, param: str) -> tuple[int, ...]:
    if not x or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in x):
        raise _bad(f"a token-id prompt must be a non-empty list of ints in [0, {vocab})", param)
    return tuple(x)


def completion_prompts(prompt: Any, tok, vocab: int) -> tuple[tuple[int, ...], ...]:
    """`prompt` of /v1/completions: a string, a list of token ids, or a list of either (a batch)."""
    if isinstance(prompt, str):
        return (tuple(tok.encode(prompt)),) if prompt else _empty()
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return (_ids(prompt, vocab, "prompt"),)
    if isinstance(prompt, list) and prompt:
        out = []
        for p in prompt:
            if isinstance(p, str) and p:
                out.append(tuple(tok.encode(p)))
            elif isinstance(p, list):
                out.append(_ids(p, vocab, "prompt"))
            else:
                raise _bad("'prompt' must be a string, a list of token ids, or a list of those", "prompt")
        return tuple(out)
    raise _bad("'prompt' must be a non-empty string, a list of token ids, or a list of those", "prompt")


def _empty():
    raise _bad("'prompt' is empty", "prompt")


def chat_prompt(messages: Any, tok) -> tuple[int, ...]:
    """The chat template of the model's tokenizer: its context start, then per message the role's
    turn markers around the encoded content (``tool`` messages as observations), then the
    assistant's opening (the agent's own layout, `horizon.agent.prompt.render`)."""
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    ids = list(tok.context_start())
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {sorted(ROLES)}", f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):       # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise _bad(f"messages[{i}].content parts must be text parts", f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string", f"messages[{i}].content")
        role = ROLES[m["role"]]
        ids += list(tok.turn_open(role)) + list(tok.encode(content)) + list(tok.turn_close(role))
    return tuple(ids + list(tok.turn_open("assistant")))


def parse_request(body: Any, tok, *, vocab: int, max_len: int, chat: bool) -> Sampling:
    """A /v1/completions (`chat=False`) or /v1/chat/completions body as `Sampling`, or `ApiError`
    (400) naming the field; the prompt plus `max_tokens` must fit the engine's `max_len`."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    prompts = (chat_prompt(body.get("messages"), tok),) if chat else completion_prompts(body.get("prompt"), tok, vocab)
    longest = max(len(p) for p in prompts)
    if longest >= max_len:
        raise _bad(f"the prompt has {longest} tokens; this server's context is {max_len}",
                   "messages" if chat else "prompt")
    mt_name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, mt_name, min(256, max_len - longest), 1, max_len - longest, integer=True)
    seed = body.get("seed")
    if seed is not None and not _is_seed(seed):
        raise _bad(f"'seed' must be an integer in [0, 2**64), got {seed!r}", "seed")
    n = int(_number(body, "n", 1, 1, 16, integer=True))
    seeds = body.get("horizon_seeds")
    if seeds is not None and (not isinstance(seeds, list) or len(seeds) != len(prompts) * n
                              or not all(_is_seed(x) for x in seeds)):
        raise _bad(f"'horizon_seeds' must list one seed in [0, 2**64) per choice ({len(prompts) * n})",
                   "horizon_seeds")
    if chat:
        logprobs = _flag(body, "logprobs")
        _number(body, "top_logprobs", 0, 0, 20, integer=True)
    else:
        logprobs = body.get("logprobs") is not None and _number(body, "logprobs", 0, 0, 5, integer=True) >= 0
    for unsupported in ("stop", "suffix", "tools", "functions", "logit_bias"):
        if body.get(unsupported) not in (None, [], {}, ""):
            raise _bad(f"'{unsupported}' is not supported by this server (docs/SERVING.md)", unsupported)
    if _flag(body, "echo"):
        raise _bad("'echo' is not supported by this server (docs/SERVING.md)", "echo")
    return Sampling(prompts=prompts, max_tokens=int(max_tokens),
                    temperature=float(_number(body, "temperature", 1.0, 0.0, 2.0)),
                    top_p=float(_number(body, "top_p", 1.0, 1e-6, 1.0)),
                    n=n, seed=seed, seeds=None if seeds is None else tuple(seeds), logprobs=logprobs,
                    stream=_flag(body, "stream"), token_ids_as_text=_flag(body, "return_tokens_as_token_ids"),
                    expert_ids=_flag(body, "return_expert_ids"), chat=chat)


def _is_seed(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < SEED_LIMIT


def choice_seeds(s: Sampling, draw) -> list[int]:
    """The seed of every choice: `horizon_seeds`, else `seed` (or a `draw()` when none) plus the choice index."""
    if s.seeds is not None:
        return list(s.seeds)
    base = draw() if s.seed is None else s.seed
    return [base + c for c in range(len(s.prompts) * s.n)]


def seed_key(seed: int) -> np.ndarray:
    """The raw threefry key data (uint32[2]) of `seed` (module docstring)."""
    seed %= SEED_LIMIT
    return np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32)


def key_seed(key_data: Sequence[int]) -> int:
    """The `seed` whose `seed_key` is `key_data` (a threefry key's two words)."""
    kd = np.asarray(key_data, np.uint64).reshape(-1)
    if kd.shape != (2,):
        raise ValueError(f"a remote seed carries a threefry key (2 words); got key data of shape {kd.shape}")
    return int(kd[0]) << 32 | int(kd[1])


def token_text(tok, t: int, as_ids: bool) -> str:
    return f"token_id:{int(t)}" if as_ids else tok.decode([int(t)])


def choice_body(tok, s: Sampling, index: int, c) -> dict:
    """One finished choice (`engine.Completion` `c`) in the request's format."""
    toks = [int(t) for t in c.tokens]
    text = shown_text(tok, toks, c.stopped)
    out: dict[str, Any] = {"index": index, "finish_reason": "stop" if c.stopped else "length",
                           "horizon_token_ids": toks, "horizon_weight_versions": [int(v) for v in c.versions]}
    if s.expert_ids:
        out["horizon_expert_ids"] = np.transpose(np.asarray(c.router_indices), (1, 0, 2)).tolist()
    lps = [float(x) for x in c.logprobs]
    strs = [token_text(tok, t, s.token_ids_as_text) for t in toks]
    if s.chat:
        out["message"] = {"role": "assistant", "content": text}
        out["logprobs"] = ({"content": [{"token": k, "logprob": lp, "bytes": list(k.encode()), "top_logprobs": []}
                                        for k, lp in zip(strs, lps)]} if s.logprobs else None)
    else:
        out["text"] = text
        offsets = np.cumsum([0] + [len(tok.decode([t])) for t in toks[:-1]]).tolist() if toks else []
        out["logprobs"] = ({"tokens": strs, "token_logprobs": lps, "top_logprobs": None, "text_offset": offsets}
                           if s.logprobs else None)
    return out


def response_body(kind: str, rid: str, model: str, choices: list[dict], prompt_tokens: int) -> dict:
    gen = sum(len(ch["horizon_token_ids"]) for ch in choices)
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": gen, "total_tokens": prompt_tokens + gen}}


def shown_text(tok, toks: Sequence[int], stopped: bool) -> str:
    """The text of generated `toks`: a final stop token is not text."""
    toks = [int(t) for t in toks]
    return tok.decode(toks[:-1] if stopped and toks and toks[-1] in set(tok.stop_ids) else toks)


def stream_text(tok, toks: Sequence[int], sent: str, finish: str | None) -> str:
    """The text a streamed choice adds now, given the text `sent` so far: before the end, a trailing
    incomplete character (a multi-byte sequence split between events, decoded as U+FFFD) waits for
    the next event, so the events put together are the unstreamed text."""
    full = shown_text(tok, toks, finish == "stop")
    if finish is None:
        full = full.rstrip("\ufffd")
    return full[len(sent):] if full.startswith(sent) else ""


def chunk_body(s: Sampling, tok, rid: str, model: str, index: int, new: Sequence[int], new_lps: Sequence[float],
               finish: str | None, text: str) -> dict:
    """One server-sent event of a streamed choice: the tokens drawn since the last event, and their text."""
    ch: dict[str, Any] = {"index": index, "finish_reason": finish, "horizon_token_ids": [int(t) for t in new]}
    strs = [token_text(tok, t, s.token_ids_as_text) for t in new]
    if s.chat:
        ch["delta"] = {"content": text}
        ch["logprobs"] = ({"content": [{"token": k, "logprob": float(lp), "bytes": list(k.encode()),
                                        "top_logprobs": []} for k, lp in zip(strs, new_lps)]} if s.logprobs else None)
    else:
        ch["text"] = text
        ch["logprobs"] = ({"tokens": strs, "token_logprobs": [float(x) for x in new_lps], "top_logprobs": None}
                          if s.logprobs else None)
    return {"id": rid, "object": "chat.completion.chunk" if s.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [ch]}
