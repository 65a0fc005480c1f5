"""SFT demonstrations of the task families, rendered in the exact agent format (docs/SPEC.md §4, §6).

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
from horizon.tools.format import FINAL_OPEN, ToolCall, render_call, render_final, tool_format

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
        r = render([Message("system", synthetic.SYSTEM_PROMPT, kind="system"),
                    Message("user", task_text(t), kind="task"),
                    Message("assistant", tokens=np.asarray(ids, np.int32))], tok)
        rows.append((r.tokens, r.loss_mask))
    return rows


def key_recall_demos(family: Family, tasks, tok, agent_cfg, sandboxes, *, corrupt_prob: float, seed: int,
                     key_alphabet: str, map_fn=map, correct_finals_only: bool = False, keep_prob: float = 1.0,
                     memo_keep_prob: float = 0.0, final_mask: str = "turn", n_keys: int = 0,
                     pin_slot: bool = False, parallel_prob: float = 0.0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Demonstration chains of `KeyRecallDemoPolicy` through the real agent loop, one
    segment per row. `sandboxes` (any backend; commands are the env's own `cat`s) are reused
    in chunks, their tool calls in as many threads; `map_fn` may run resets in threads. Under
    observation masking the demonstrator notes each key in its own next turn (`notes`: the memory masking keeps). With
    `correct_finals_only` a chain's final answer is trained on only when it is right (a sliding
    window's answer is a guess: its reads are still its own correct demonstration). `keep_prob` and
    `memo_keep_prob`: the long-horizon family's omission rule (`KeyRecallDemoPolicy`). `final_mask`:
    what of a wrong final `correct_finals_only` leaves out of the loss, the whole turn ("turn") or,
    with slot-aligned answers (`n_keys`, `pin_slot`), only its letters that differ from the task's
    answer in the same slot ("letters": the turn still teaches when to answer and the slot layout).
    `parallel_prob`: the share of turns that read two logs at once (`KeyRecallDemoPolicy`)."""
    if final_mask not in FINAL_MASKS:
        raise ValueError(f"final_mask must be one of {FINAL_MASKS}, got {final_mask!r}")
    if final_mask == "letters" and not n_keys:
        raise ValueError("final_mask='letters' needs slot-aligned answers (n_keys > 0)")
    policy = KeyRecallDemoPolicy(tok, corrupt_prob, seed, key_alphabet,
                                 notes=agent_cfg.context_strategy == "observation_masking", keep_prob=keep_prob,
                                 memo_keep_prob=memo_keep_prob, n_keys=n_keys if final_mask == "letters" else 0,
                                 pin_slot=pin_slot, parallel_prob=parallel_prob)
    rows = []
    n = len(sandboxes)
    for i in range(0, len(tasks), n):
        chunk = tasks[i:i + n]
        list(map_fn(family.reset, sandboxes[:len(chunk)], chunk))
        eps = [make_episode(family, t, sb, tok, agent_cfg) for t, sb in zip(chunk, sandboxes)]
        for t, tr in zip(chunk, run_episodes(policy, eps, num_tool_workers=n)):   # reads run in n threads
            if tr.infra:        # a sandbox failure cut the chain short: not a demonstration (docs/SPEC.md §4.1)
                print(f"[demos] {tr.task_id}: sandbox failed ({tr.failure[:120]}); chain dropped", flush=True)
                continue
            segs = [(s.tokens, s.loss_mask) for s in tr.segments if s.loss_mask.any()]
            if correct_finals_only and tr.end_reason == "final" and tr.final_answer != t.final_answer and segs:
                tokens, mask = segs[-1]
                segs[-1] = (tokens, mask_final_turn(tokens, mask) if final_mask == "turn" else
                            mask_wrong_letters(tokens, mask, t.final_answer, tok))
            rows += [r for r in segs if r[1].any()]
    return rows


FINAL_MASKS = ("turn", "letters")


def mask_wrong_letters(tokens: np.ndarray, loss_mask: np.ndarray, expected: str, tok) -> np.ndarray:
    """`loss_mask` without the letters of the last generated span's answer ("#A #G ...") that differ
    from `expected`'s letter in the same slot (a guess where the memory lost the fact)."""
    m = np.asarray(loss_mask, bool).copy()
    span = np.nonzero(m & ~mask_final_turn(tokens, m))[0]          # the final turn's trained positions
    want = key_recall.ANSWER_LETTER_RE.findall(expected)
    slot = 0
    for i in span:
        before, piece = tok.decode([int(t) for t in tokens[span[0]:i]]), tok.decode([int(tokens[i])])
        if FINAL_OPEN in before and before.endswith(key_recall.KEY_MARK) and len(piece) == 1 and piece.isupper():
            if slot >= len(want) or piece != want[slot]:
                m[i] = False
            slot += 1
    return m


def mask_final_turn(tokens: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """`loss_mask` without its last generated span (the final answer turn of a chain's last segment)."""
    m = np.asarray(loss_mask, bool).copy()
    idx = np.nonzero(m)[0]
    if len(idx):
        end = idx[-1]
        start = end
        while start > 0 and m[start - 1]:
            start -= 1
        m[start:end + 1] = False
    return m


def _turns_of(context, tok) -> tuple[str, str, str]:
    """(whole context text, last non-assistant message text, the assistant turns' text)."""
    turns = split_turns(context, tok)
    last = next((t for r, t in reversed(turns) if r != "assistant"), "")
    return "\n".join(t for _, t in turns), last, "\n".join(t for r, t in turns if r == "assistant")


def ordered_keys(text: str) -> list[str]:
    """The keys ("key #Q") in `text`, each once, in order of first appearance."""
    return list(dict.fromkeys(key_recall.KEY_RE.findall(text)))


SUMMARY_QUERIES = {key_recall.SUMMARY_QUERY: "self_summary", key_recall.COMPACTION_QUERY: "prompt_compaction",
                   key_recall.CONDENSER_QUERY: "summarizing_condenser"}      # the family's query -> strategy


def summary_kind(context, tok) -> tuple[str | None, str]:
    """(the strategy whose summary query ends `context`, or None; the context's text)."""
    text, last_msg, _ = _turns_of(context, tok)
    return SUMMARY_QUERIES.get(last_msg), text


def carried_memory(text: str) -> str:
    """The memory a rewritten context carries (its summary message, from `SUMMARY_HEADER` to the
    first call after it), "" in a context never rewritten."""
    at = text.find(key_recall.SUMMARY_HEADER.strip())
    if at < 0:
        return ""
    end = text.find("<function=", at)
    return text[at:] if end < 0 else text[at:end]


def _file_list(names: list[str], n_logs: int) -> str:
    """Files as a memory lists them: each name, or on a family of more than 9 logs (the long-horizon
    one) the first and last joined by "to" where there are more than two, which keeps a compaction
    summary inside the context limit."""
    return " ".join(names) if n_logs <= 9 or len(names) <= 2 else f"{names[0]} to {names[-1]}"


@dataclasses.dataclass
class KeyRecallDemoPolicy:
    """Scripted demonstrator of the key-recall families that acts from the context only, the way a
    model would: the keys from the observations, a previous summary or its own notes, progress
    from the last `read` call or the summary. Every memory it writes carries the keys in the place
    meant for values: a self-summary ("key #Q, last 2.log"), prompt compaction's "facts" section,
    the condenser's "state" section, and under observation masking (`notes`) a ``<think>key
    #Q</think>`` note in its own turn after the key's observation (the model's turns are what
    masking keeps). With probability `corrupt_prob` a memory writes one wrong key (a decoy seen in
    the context if any, else another letter); the final answer copies the keys the context holds,
    in order, so a lossy memory costs the chain its reward: the signal RL through summaries learns
    from (docs/SPEC.md §6: the final reward applies to every token of the chain). Deterministic: the draw
    is a hash of (seed, context).

    On the long-horizon family (pins and memos, `horizon.tasks.key_recall` "Long horizons") a memory
    lists every fact the context holds — keys, the pin, "pin needed", memos, in that order — and the
    lossy-demo rule is omission, not corruption: a key, the pin or "pin needed" read since the last
    memory is kept with probability `keep_prob`, a memo with `memo_keep_prob`, and a fact an earlier
    memory holds is kept (`_kept`). Every fact written is a correct copy (the copy still forms in SFT),
    but which new facts a summary keeps is left for RL to learn (docs/SPEC.md §6). The final answer
    appends the pin where the context says it is needed.
    `keep_prob=1, memo_keep_prob=0` is the perfect summarizer (the study's oracle).
    With `parallel_prob` > 0 a turn that has two logs left to read reads both at once with that
    probability (parallel calls, docs/SPEC.md §5; the episodes need `agent.max_parallel_calls` >= 2),
    drawn from its own hash of the context, so the other draws are the same at any `parallel_prob`."""

    tok: object
    corrupt_prob: float = 0.0
    seed: int = 0
    key_alphabet: str = key_recall.KEY_ALPHABET
    notes: bool = False
    keep_prob: float = 1.0
    memo_keep_prob: float = 0.0
    n_keys: int = 0                 # > 0: slot-aligned answers (`aligned_answer`; slot-alphabet families)
    pin_slot: bool = False          # the alphabet has the pin's slice after the keys' (pin_prob > 0)
    parallel_prob: float = 0.0      # a turn reads the next two logs in one turn (parallel calls)

    def _rng(self, text: str) -> random.Random:
        return random.Random(zlib.crc32(text.encode()) ^ (self.seed * 0x9E3779B1))

    def _parallel(self, text: str) -> bool:
        """Whether this turn reads two logs at once (`parallel_prob`; a draw of its own)."""
        if self.parallel_prob <= 0:
            return False
        return random.Random(zlib.crc32(b"parallel" + text.encode()) ^ self.seed).random() < self.parallel_prob

    def _keys(self, text: str, rng: random.Random) -> list[str]:
        return ordered_keys(text) or [rng.choice(self.key_alphabet)]   # none in context: a guess

    def _last_log(self, text: str) -> int:
        reads = [int(x) for x in key_recall.READ_RE.findall(text) + key_recall.LAST_RE.findall(text)]
        return max(reads) if reads else 0

    def _memory_keys(self, keys: list[str], text: str, rng: random.Random) -> str:
        """The memory text of `keys` ("key #Q, key #Z"), one of them wrong with prob. `corrupt_prob`."""
        keys = list(keys)
        if rng.random() < self.corrupt_prob:             # a lossy memory
            i = rng.randrange(len(keys)) if len(keys) > 1 else 0
            decoys = [d for d in key_recall.DECOY_RE.findall(text) if d not in keys]
            keys[i] = rng.choice(decoys or [k for k in self.key_alphabet if k not in keys])
        return ", ".join(f"key {key_recall.KEY_MARK}{k}" for k in keys)

    def _memory(self, text: str, rng: random.Random) -> str:
        """The facts a memory writes: the keys (`_memory_keys`), or on the long-horizon family every
        fact of the context minus the omissions of the lossy rule (class docstring, `_kept`)."""
        extra = [f for f in dict.fromkeys(key_recall.FACT_RE.findall(text)) if not f.startswith("key ")]
        if not extra and self.keep_prob >= 1.0:
            return self._memory_keys(self._keys(text, rng), text, rng)
        keys = ordered_keys(text)
        mem = self._memory_keys(keys, text, rng).split(", ") if keys else []
        items = mem + sorted(extra, key=lambda f: f.startswith("memo"))       # keys, pin facts, then memos
        held = carried_memory(text)
        return ", ".join(f for f in items if self._kept(f, text, held))

    def _kept(self, fact: str, text: str, held: str) -> bool:
        """Whether a memory keeps `fact`: always where the earlier memory `held` (`carried_memory` of
        `text`) holds it (what was kept stays kept), else one draw per fact and task — keyed on the
        fact and the observation it came in, so every memory of the episode that sees the
        observation decides alike and a
        strategy that summarizes more often is not dropped from more often."""
        if fact in held:
            return True
        at = text.find(fact)
        where = text[max(0, at - 40):at + 40]
        p = self.memo_keep_prob if fact.startswith("memo") else self.keep_prob
        return random.Random(zlib.crc32(f"{fact}|{where}".encode()) ^ (self.seed * 0x9E3779B1)).random() < p

    def answer(self, text: str, keys: list[str]) -> str:
        """The final answer: `keys` in order, and the pin where `text` says it is needed."""
        pin = key_recall.PIN_RE.findall(text)
        tail = [pin[0]] if pin and key_recall.PIN_NEEDED in text else []
        return " ".join(key_recall.KEY_MARK + k for k in keys + tail)

    def aligned_answer(self, text: str, rng: random.Random) -> str:
        """The answer slot by slot (slot-alphabet families): slot i holds the context's key from the
        i-th slice of the alphabet, or a guess from that slice where the context lost it (masked out of
        the loss by `key_recall_demos(final_mask="letters")` unless right by chance); the pin's slot
        follows where the context says it is needed. A lost key no longer shifts the later keys into
        the wrong slots."""
        slots = self.n_keys + self.pin_slot
        found, out = ordered_keys(text), []
        for i in range(self.n_keys):
            alpha = key_recall.slot_alphabet(self.key_alphabet, slots, i)
            out.append(next((k for k in found if k in alpha), None) or rng.choice(alpha))
        if key_recall.PIN_NEEDED in text:
            pins = key_recall.PIN_RE.findall(text)
            out.append(pins[0] if pins else rng.choice(key_recall.slot_alphabet(self.key_alphabet, slots, self.n_keys)))
        return " ".join(key_recall.KEY_MARK + k for k in out)

    def summary(self, text: str, kind: str = "self_summary") -> str:
        rng = self._rng(text)
        keys = self._memory(text, rng)
        last, n = self._last_log(text), key_recall.n_logs_of(text)
        if kind == "self_summary":
            return f"<summary>{keys + ', ' if keys else ''}last {last}.log</summary>"
        pending = _file_list([f"{i}.log" for i in range(last + 1, n + 1)], n) or "none"
        done = _file_list([key_recall.KEY_FILE] + [f"{i}.log" for i in range(1, last + 1)], n)
        if kind == "summarizing_condenser":
            body = {"context": f"read key.txt, {n} logs; reply keys", "completed": done, "pending": pending,
                    "state": f"{keys}, last {last}.log"}
            return "<summary>" + "\n".join(f"{s}: {body[s]}" for s in key_recall.CONDENSER_SECTIONS) + "</summary>"
        nxt = f"read {last + 1}.log" if last < n else "reply key"
        body = {"request": f"read key.txt, {n} logs; reply key", "concepts": "logs, key", "files": done,
                "errors": "none", "solving": "read logs in order", "facts": keys,
                "messages": "1 task", "pending": pending, "current": f"{last}.log", "next": nxt}
        return "<summary>" + "\n".join(f"{i} {s}: {body[s]}" for i, s in
                                       enumerate(key_recall.COMPACTION_SECTIONS, 1)) + "</summary>"

    def _note(self, last_msg: str, own: str, text: str) -> str | None:
        """Under masking: a note of the keys in the last observation not yet in the own turns."""
        new = [k for k in ordered_keys(last_msg) if f"key {key_recall.KEY_MARK}{k}" not in own]
        if not self.notes or not new:
            return None
        return self._memory_keys(new, text, self._rng(text))

    def act(self, context) -> str:
        text, last_msg, own = _turns_of(context, self.tok)
        if last_msg in SUMMARY_QUERIES:
            return self.summary(text, SUMMARY_QUERIES[last_msg])
        if self._last_log(text) == 0 and not key_recall.KEY_RE.search(text):     # nothing read yet
            return render_call("read", {"path": key_recall.KEY_FILE})
        last, n = self._last_log(text), key_recall.n_logs_of(text)
        note = self._note(last_msg, own, text)
        if last + 1 < n and self._parallel(text):
            reads = [ToolCall("read", {"path": f"{i}.log"}) for i in (last + 1, last + 2)]
            return tool_format().render_calls(reads, thinking=note)
        if last < n:
            return render_call("read", {"path": f"{last + 1}.log"}, thinking=note)
        if self.n_keys:
            return render_final(self.aligned_answer(text + "\n" + (note or ""), self._rng(text)), thinking=note)
        keys = ordered_keys(text + "\n" + (note or "")) or self._keys(text, self._rng(text))
        return render_final(self.answer(text, keys), thinking=note)

    def __call__(self, contexts, max_new_tokens: int):
        out = []
        for ctx in contexts:
            ids = np.asarray(self.tok.encode(self.act(ctx)) + [self.tok.end_turn_id], np.int32)[:max_new_tokens]
            out.append(Generation(ids, np.zeros(len(ids), np.float32), None, 0))
        return out
