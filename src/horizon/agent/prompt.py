"""Prompt layout and the message -> token renderer (SPEC §5).

A context is `BOS` followed by messages; each message is
`ROLE_SPECIAL text-tokens END_TURN` with ROLE_SPECIAL in SYSTEM / USER / ASSISTANT /
OBSERVATION. Generation starts after a bare `ASSISTANT` token. An assistant message
stores the exact generated ids (including the END_TURN/EOS the model emitted) with
their logprobs, router choices and policy versions; only those ids are marked
model-generated (loss mask True). If the model hit its token limit without END_TURN,
the harness appends an END_TURN that is NOT model-generated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jaxtyping import Bool, Float, Int

ROLES = ("system", "user", "assistant", "observation")

SYSTEM_TEMPLATE = """You are a coding agent working in a sandboxed repository at /workspace.
Solve the user's task by calling tools, one call per turn, then give a short final message.

Turn format: optionally think inside <think>...</think>, then EITHER one tool call
<function=NAME>
<parameter=KEY>VALUE</parameter>
</function>
OR, when you are done, <final>your final message</final>.
Values are raw text (no escaping; they may span lines). Use absolute paths.

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

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")

    @property
    def generated(self) -> bool:
        return self.tokens is not None


@dataclasses.dataclass
class Rendered:
    """A rendered context; arrays are aligned to `tokens`."""

    tokens: Int[np.ndarray, "n"]
    loss_mask: Bool[np.ndarray, "n"]
    logprobs: Float[np.ndarray, "n"]
    policy_versions: Int[np.ndarray, "n"]      # -1 where not generated
    router_indices: Any                        # int32[L_moe, n, k] (-1 where not generated) or None


def role_token(tok, role: str) -> int:
    return {"system": tok.SYSTEM, "user": tok.USER, "assistant": tok.ASSISTANT,
            "observation": tok.OBSERVATION}[role]


def system_prompt(registry) -> str:
    return SYSTEM_TEMPLATE.format(tools=registry.spec_text())


def task_text(task, file_listing: str | None = None) -> str:
    text = task.prompt.strip()
    if file_listing:
        text += f"\n\nFiles in /workspace:\n{file_listing}"
    return text


def message_ids(m: Message, tok) -> list[int]:
    """Ids of one message (prompt-side view; generated ids for assistant messages)."""
    head = [role_token(tok, m.role)]
    if m.tokens is not None:
        body = [int(t) for t in m.tokens]
        if not body or body[-1] not in (tok.END_TURN, tok.EOS):
            body.append(tok.END_TURN)
        return head + body
    return head + tok.encode(m.text) + [tok.END_TURN]


def render(messages: list[Message], tok, *, add_generation_prompt: bool = False) -> Rendered:
    """Token ids of a message list plus the loss mask / logprob / version / router arrays."""
    ids: list[int] = [tok.BOS]
    mask: list[bool] = [False]
    lps: list[float] = [0.0]
    vers: list[int] = [-1]
    routers: list[tuple[int, np.ndarray]] = []   # (offset, [L, m, k]) of generated spans
    any_router = False
    all_router = True
    for m in messages:
        mids = message_ids(m, tok)
        start = len(ids)
        ids += mids
        if m.tokens is not None:
            g = len(m.tokens)
            mask += [False] + [True] * g + [False] * (len(mids) - 1 - g)
            lp = np.zeros(len(mids), np.float32)
            if m.logprobs is not None:
                lp[1:1 + g] = np.asarray(m.logprobs, np.float32)
            lps += lp.tolist()
            v = np.full(len(mids), -1, np.int64)
            if m.policy_versions is not None:
                v[1:1 + g] = np.asarray(m.policy_versions)
            vers += v.tolist()
            if m.router_indices is not None:
                any_router = True
                routers.append((start + 1, np.asarray(m.router_indices)))
            else:
                all_router = False
        else:
            mask += [False] * len(mids)
            lps += [0.0] * len(mids)
            vers += [-1] * len(mids)
    if add_generation_prompt:
        ids.append(tok.ASSISTANT)
        mask.append(False)
        lps.append(0.0)
        vers.append(-1)
    router = None
    if any_router and all_router:
        L, _, k = routers[0][1].shape
        router = np.full((L, len(ids), k), -1, np.int32)
        for off, r in routers:
            router[:, off:off + r.shape[1]] = r
    return Rendered(np.asarray(ids, np.int32), np.asarray(mask, bool), np.asarray(lps, np.float32),
                    np.asarray(vers, np.int32), router)


def split_turns(tokens, tok) -> list[tuple[str, str]]:
    """(role, text) pairs of a rendered context (for scripted policies / debugging)."""
    by_id = {tok.SYSTEM: "system", tok.USER: "user", tok.ASSISTANT: "assistant", tok.OBSERVATION: "observation"}
    out: list[tuple[str, list[int]]] = []
    for t in np.asarray(tokens).reshape(-1).tolist():
        if t in by_id:
            out.append((by_id[t], []))
        elif t in (tok.END_TURN, tok.EOS, tok.BOS, tok.PAD):
            continue
        elif out:
            out[-1][1].append(t)
    return [(r, tok.decode(ids)) for r, ids in out]
