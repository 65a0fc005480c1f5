"""What a policy returns: one generated turn (`Generation`), and the batched policy's signature."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from jaxtyping import Float, Int


@dataclasses.dataclass
class Generation:
    """One generated turn from the policy. Generation stops at END_TURN/EOS (included)."""

    tokens: Int[np.ndarray, " m"]
    logprobs: Float[np.ndarray, " m"]
    router_indices: Any = None          # int32[L_moe, m, k] or None
    policy_version: Any = 0             # int, or int32[m] per token (in-flight weight updates)

    def versions(self) -> np.ndarray:
        v = np.asarray(self.policy_version, np.int32)
        return np.full(len(self.tokens), int(v), np.int32) if v.ndim == 0 else v


Policy = Callable[[list, int], list]   # policy(contexts: list[int32[n]], max_new_tokens) -> list[Generation]
