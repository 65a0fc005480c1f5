"""Prompt layout and the message -> token renderer (docs/SPEC.md §5).

The layout is the tokenizer's chat format (`horizon.data.tokenizer`): a context is
`tok.context_start()` followed by messages, each `tok.turn_open(role) text tok.turn_close(role)`
(byte tokenizer: ``BOS``, then ``ROLE text END_TURN`` per message). Generation starts after a bare
`tok.turn_open("assistant")`. An assistant message stores the exact generated ids (including the
end-of-turn / EOS the model emitted) with their logprobs, router choices and policy versions; only
those ids are marked model-generated (loss mask True). If the model hit its token limit without a
stop id, the harness appends the closing piece, NOT model-generated; after a stop id, the closing
piece's remaining separator (if the format has one) is appended the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jaxtyping import Bool, Float, Int

from horizon.tools.format import tool_format

ROLES = ("system", "user", "assistant", "observation")

SYSTEM_TEMPLATE = """You are a coding agent working in a sandboxed repository at /workspace.
Solve the user's task by calling tools, one call per turn, then give a short final message.

{format}

Tools:
{tools}"""


@dataclasses.dataclass
class Message:
    role: str                                  # one of ROLES
    text: str = ""
    kind: str = ""                             # tag: "task" | "summary_query" | "summary" | "state" | ...
    tokens: np.ndarray | None = None           # assistant: exact generated ids (overrides text)
    logprobs: np.ndarray | None = None         # f32[m], aligned with tokens
    router_indices: np.ndarray | None = None   # int32[L_moe, m, k] or None
    policy_versions: np.ndarray | None = None  # int32[m]
    carried: bool = False                      # generated in an earlier segment: context here, not trained

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")

    @property
    def generated(self) -> bool:
        return self.tokens is not None

    @property
    def trained(self) -> bool:
        """Whether this message's tokens are in the loss mask of the context it is rendered in: a
        turn generated there, not one `carried` over a context rewrite (`carry_over`)."""
        return self.tokens is not None and not self.carried


def carry_over(messages: list[Message]) -> list[Message]:
    """`messages` as the first context of a new segment (a summary, a masking or window rewrite):
    every generated turn kept from the old context becomes `carried` — same tokens, so the new
    context renders exactly as the policy sees it, but out of the loss mask. Each generated token
    is trained once, in the context it was sampled from: its recorded logprobs, versions and routing
    belong to that context (docs/SPEC.md §4.1 ratios and router replay, §6 segments), and a carried note
    (observation masking's `<think>key #Q`) sits after its masked source, where it cannot be
    predicted (docs/PERF.md, the self-summarization study "each token trained once")."""
    return [dataclasses.replace(m, carried=True) if m.trained else m for m in messages]


@dataclasses.dataclass
class Rendered:
    """A rendered context; arrays are aligned to `tokens`."""

    tokens: Int[np.ndarray, " n"]
    loss_mask: Bool[np.ndarray, " n"]
    logprobs: Float[np.ndarray, " n"]
    policy_versions: Int[np.ndarray, " n"]      # -1 where not generated
    router_indices: Any                        # int32[L_moe, n, k] (-1 where not generated) or None


def system_prompt(registry, fmt=None) -> str:
    """The system message: the task framing, the tool-call format's instructions (`fmt`, a
    `horizon.tools.format.ToolCallFormat`; default the horizon format) and the tools' specs."""
    return SYSTEM_TEMPLATE.format(format=(fmt or tool_format()).instructions, tools=registry.spec_text())


def task_text(task, file_listing: str | None = None) -> str:
    text = task.prompt.strip()
    if file_listing:
        text += f"\n\nFiles in /workspace:\n{file_listing}"
    return text


def message_ids(m: Message, tok) -> list[int]:
    """Ids of one message (prompt-side view; generated ids for assistant messages)."""
    head, close = tok.turn_open(m.role), tok.turn_close(m.role)
    if m.tokens is not None:
        body = [int(t) for t in m.tokens]
        stopped = bool(body) and body[-1] in tok.stop_ids
        return head + body + (close[1:] if stopped else close)
    return head + tok.encode(m.text) + close


def render(messages: list[Message], tok, *, add_generation_prompt: bool = False) -> Rendered:
    """Token ids of a message list plus the loss mask / logprob / version / router arrays."""
    ids: list[int] = list(tok.context_start())
    mask: list[bool] = [False] * len(ids)
    lps: list[float] = [0.0] * len(ids)
    vers: list[int] = [-1] * len(ids)
    routers: list[tuple[int, np.ndarray]] = []   # (offset, [L, m, k]) of generated spans
    any_router = False
    all_router = True
    for m in messages:
        mids = message_ids(m, tok)
        start = len(ids)
        ids += mids
        if m.trained:
            g, h = len(m.tokens), len(tok.turn_open(m.role))
            mask += [False] * h + [True] * g + [False] * (len(mids) - h - g)
            lp = np.zeros(len(mids), np.float32)
            if m.logprobs is not None:
                lp[h:h + g] = np.asarray(m.logprobs, np.float32)
            lps += lp.tolist()
            v = np.full(len(mids), -1, np.int64)
            if m.policy_versions is not None:
                v[h:h + g] = np.asarray(m.policy_versions)
            vers += v.tolist()
            if m.router_indices is not None:
                any_router = True
                routers.append((start + h, np.asarray(m.router_indices)))
            else:
                all_router = False
        else:
            mask += [False] * len(mids)
            lps += [0.0] * len(mids)
            vers += [-1] * len(mids)
    if add_generation_prompt:
        gp = tok.turn_open("assistant")
        ids += gp
        mask += [False] * len(gp)
        lps += [0.0] * len(gp)
        vers += [-1] * len(gp)
    router = None
    if any_router and all_router:
        L, _, k = routers[0][1].shape
        router = np.full((L, len(ids), k), -1, np.int32)
        for off, r in routers:
            router[:, off:off + r.shape[1]] = r
    return Rendered(np.asarray(ids, np.int32), np.asarray(mask, bool), np.asarray(lps, np.float32),
                    np.asarray(vers, np.int32), router)


def split_turns(tokens, tok) -> list[tuple[str, str]]:
    """(role, text) pairs of a rendered context (for scripted policies / debugging): a turn starts
    at a role's opening piece; closing pieces, stop ids and the context start are not text."""
    ids = np.asarray(tokens).reshape(-1).tolist()
    opens = sorted(((tok.turn_open(r), r) for r in ROLES), key=lambda x: -len(x[0]))
    closes = sorted({tuple(tok.turn_close(r)) for r in ROLES}, key=len, reverse=True)
    skip = set(tok.stop_ids) | {tok.pad_id} | set(tok.context_start())
    out: list[tuple[str, list[int]]] = []
    i = 0
    while i < len(ids):
        hit = next(((o, r) for o, r in opens if o and ids[i:i + len(o)] == o), None)
        if hit is not None:
            out.append((hit[1], []))
            i += len(hit[0])
            continue
        c = next((c for c in closes if c and ids[i:i + len(c)] == list(c)), None)
        if c is not None:
            i += len(c)
            continue
        if ids[i] not in skip and out:
            out[-1][1].append(ids[i])
        i += 1
    return [(r, tok.decode(t)) for r, t in out]
