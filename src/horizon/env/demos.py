"""SFT demonstrations of the task families, rendered in the exact agent format (SPEC §4, §6).

`config_edit_demos`: the canonical one-call solution per task (a fraction with the
demonstrator's wrong value). `key_recall_demos`: chains of `KeyRecallDemoPolicy` rolled out
through the real agent loop (`horizon.agent.run_episodes`), so every segment, summary query
and state block is exactly what the policy will see.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

import numpy as np

from horizon.agent import Generation, Message, render, run_episodes
from horizon.agent.prompt import split_turns, task_text
from horizon.env.families import Family, make_episode
from horizon.tasks import key_recall, synthetic
from horizon.tools.format import render_call, render_final

CORRUPTIONS = ("next", "random")


def config_edit_demos(tasks, tok, rng: np.random.Generator, *, corrupt_prob: float, value_range: tuple[int, int],
                      corrupt: str = "next") -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens, loss_mask) of the canonical one-call solution per task, in the agent format.

    With probability `corrupt_prob` the demonstrated value is wrong: `corrupt="next"` writes the
    next value of `value_range` (v+1, wrapping: a systematic off-by-one of the demonstrator, so
    the copy of the prompt's digit is still what predicts the demo), `"random"` a uniformly random
    one (the copy then predicts only a fraction of demos, and a tiny model learns it much later)."""
    if corrupt not in CORRUPTIONS:
        raise ValueError(f"corrupt must be one of {CORRUPTIONS}, got {corrupt!r}")
    lo, hi = value_range
    rows = []
    for t in tasks:
        call = dict(t.solution[0])
        args = dict(call["args"])
        if rng.random() < corrupt_prob:
            v = int(args["value"])
            args["value"] = str(v + 1 if v < hi else lo) if corrupt == "next" else str(int(rng.integers(lo, hi + 1)))
        ids = tok.encode(render_call(call["name"], args)) + [tok.end_turn_id]
        r = render([Message("system", synthetic.SYSTEM_PROMPT, kind="system"), Message("user", task_text(t), kind="task"),
                    Message("assistant", tokens=np.asarray(ids, np.int32))], tok)
        rows.append((r.tokens, r.loss_mask))
    return rows


def key_recall_demos(family: Family, tasks, tok, agent_cfg, sandboxes, *, corrupt_prob: float, seed: int,
                     key_alphabet: str, map_fn=map) -> list[tuple[np.ndarray, np.ndarray]]:
    """Demonstration chains of `KeyRecallDemoPolicy` through the real agent loop, one
    segment per row. `sandboxes` (any backend; commands are the env's own `cat`s) are reused
    in chunks; `map_fn` may run resets in threads."""
    policy = KeyRecallDemoPolicy(tok, corrupt_prob, seed, key_alphabet)
    rows = []
    n = len(sandboxes)
    for i in range(0, len(tasks), n):
        chunk = tasks[i:i + n]
        list(map_fn(family.reset, sandboxes[:len(chunk)], chunk))
        eps = [make_episode(family, t, sb, tok, agent_cfg) for t, sb in zip(chunk, sandboxes)]
        for tr in run_episodes(policy, eps):
            if tr.infra:        # a sandbox failure cut the chain short: not a demonstration (issue 21)
                print(f"[demos] {tr.task_id}: sandbox failed ({tr.failure[:120]}); chain dropped", flush=True)
                continue
            rows += [(s.tokens, s.loss_mask) for s in tr.segments if s.loss_mask.any()]
    return rows


def _text_of(context, tok) -> tuple[str, str]:
    """(whole context text, last non-assistant message text)."""
    turns = split_turns(context, tok)
    last = next((t for r, t in reversed(turns) if r != "assistant"), "")
    return "\n".join(t for _, t in turns), last


@dataclasses.dataclass
class KeyRecallDemoPolicy:
    """Scripted demonstrator of the key-recall family that acts from the context only, the way a
    model would: the key from the key.txt observation or a previous summary, progress from the
    last `read` call or the summary. With probability `corrupt_prob` a summary writes a wrong key
    (a decoy seen in the context if any, else another letter); the final answer copies whatever
    key the context holds, so a lossy summary costs the chain its reward: the signal RL through
    summaries learns from (SPEC §6: the final reward applies to every token of the chain).

    `corrupt_prob`: probability that a summary writes a wrong key (a decoy seen in the
    context if any, else a random key). Deterministic: the draw is a hash of (seed, context)."""

    tok: object
    corrupt_prob: float = 0.0
    seed: int = 0
    key_alphabet: str = key_recall.KEY_ALPHABET

    def _rng(self, text: str) -> random.Random:
        return random.Random(zlib.crc32(text.encode()) ^ (self.seed * 0x9E3779B1))

    def _key(self, text: str, rng: random.Random) -> str:
        keys = key_recall.KEY_RE.findall(text)
        return keys[-1] if keys else rng.choice(self.key_alphabet)   # not in context: a guess

    def _last_log(self, text: str) -> int:
        reads = [int(x) for x in key_recall.READ_RE.findall(text) + key_recall.LAST_RE.findall(text)]
        return max(reads) if reads else 0

    def summary(self, text: str, compaction: bool) -> str:
        rng = self._rng(text)
        key = self._key(text, rng)
        if rng.random() < self.corrupt_prob:             # a lossy summary
            decoys = [d for d in key_recall.DECOY_RE.findall(text) if d != key]
            key = rng.choice(decoys or [k for k in self.key_alphabet if k != key])
        last, n = self._last_log(text), key_recall.n_logs_of(text)
        if not compaction:
            return f"<summary>key {key_recall.KEY_MARK}{key}, last {last}.log</summary>"
        pending = " ".join(f"{i}.log" for i in range(last + 1, n + 1)) or "none"
        done = " ".join([key_recall.KEY_FILE] + [f"{i}.log" for i in range(1, last + 1)])
        nxt = f"read {last + 1}.log" if last < n else "reply key"
        body = {"request": f"read key.txt, {n} logs; reply key", "concepts": "logs, key", "files": done,
                "errors": "none", "solving": "read logs in order", "facts": f"key {key_recall.KEY_MARK}{key}",
                "messages": "1 task", "pending": pending, "current": f"{last}.log", "next": nxt}
        return "<summary>" + "\n".join(f"{i} {s}: {body[s]}" for i, s in
                                       enumerate(key_recall.COMPACTION_SECTIONS, 1)) + "</summary>"

    def act(self, context) -> str:
        text, last_msg = _text_of(context, self.tok)
        if last_msg in (key_recall.SUMMARY_QUERY, key_recall.COMPACTION_QUERY):
            return self.summary(text, compaction=last_msg == key_recall.COMPACTION_QUERY)
        if self._last_log(text) == 0 and not key_recall.KEY_RE.search(text):     # nothing read yet
            return render_call("read", {"path": key_recall.KEY_FILE})
        last, n = self._last_log(text), key_recall.n_logs_of(text)
        if last < n:
            return render_call("read", {"path": f"{last + 1}.log"})
        return render_final(key_recall.KEY_MARK + self._key(text, self._rng(text)))

    def __call__(self, contexts, max_new_tokens: int):
        out = []
        for ctx in contexts:
            ids = np.asarray(self.tok.encode(self.act(ctx)) + [self.tok.end_turn_id], np.int32)[:max_new_tokens]
            out.append(Generation(ids, np.zeros(len(ids), np.float32), None, 0))
        return out
