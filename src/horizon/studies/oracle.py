"""The oracle-summary policy of the RL self-summarization study (docs/RESULTS.md, "headroom").

The trained policy acts, but every summary turn is the demonstrator's perfect summary of the context
(`KeyRecallDemoPolicy` with `keep_prob=1`, `memo_keep_prob=0`: every needed fact, no memo). Its
success over the SFT policy's is what better summaries alone could gain: the headroom RL has on
this family. It wraps any policy: a plain batched callable, or the rollout engine's `stream()`
(summary turns are answered at submit time and never reach the engine; the engine prefills the
injected tokens with the next turn like any other context change).
"""

from __future__ import annotations

from horizon.env.demos import KeyRecallDemoPolicy, summary_kind
from horizon.inference.policy import Generation, StreamWrapper


class OracleSummaries:
    """`policy` with the demonstrator's perfect summaries injected (module docstring)."""

    def __init__(self, policy, tok, seed: int = 0):
        self.policy, self.tok = policy, tok
        self.demo = KeyRecallDemoPolicy(tok, 0.0, seed, keep_prob=1.0, memo_keep_prob=0.0)
        self.injected = 0
        if callable(getattr(policy, "stream", None)):
            self.stream = lambda: _OracleStream(self, policy.stream())

    def summary(self, context, max_new_tokens: int) -> Generation | None:
        """The perfect summary turn for `context` (at most `max_new_tokens`, as the policy's would be),
        or None where the context asks for an action."""
        if summary_kind(context, self.tok)[0] is None:
            return None
        self.injected += 1
        return self.demo([context], max_new_tokens)[0]

    def __call__(self, contexts, max_new_tokens: int) -> list:
        out = [self.summary(c, max_new_tokens) for c in contexts]
        rest = [i for i, g in enumerate(out) if g is None]
        for i, g in zip(rest, self.policy([contexts[i] for i in rest], max_new_tokens) if rest else []):
            out[i] = g
        return out

    @property
    def state(self) -> dict:
        return getattr(self.policy, "state", None) or {}


class _OracleStream(StreamWrapper):
    """An engine stream whose summary turns are answered by the oracle without the engine."""

    def __init__(self, oracle: OracleSummaries, inner):
        super().__init__(inner)
        self.oracle, self.ready = oracle, []

    def submit(self, episode: int, context, max_new_tokens: int) -> None:
        g = self.oracle.summary(context, max_new_tokens)
        if g is None:
            self.inner.submit(episode, context, max_new_tokens)
        else:
            self.ready.append((episode, g))

    def advance(self) -> list:
        out, self.ready = self.ready, []
        return out + (self.inner.advance() if self.inner.busy else [])

    @property
    def busy(self) -> bool:
        return bool(self.ready) or self.inner.busy
