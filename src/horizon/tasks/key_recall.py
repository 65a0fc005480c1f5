"""Procedurally generated key-recall tasks: self-summarization at tiny scale (docs/SPEC.md §6).

The hand-written recall family (`horizon.tasks.recall`) reads ~50 KB of logs, far beyond
what a byte-level tiny model can learn on CPU. This family keeps its *structure* at a
size the tiny model trains on in minutes, so the self-summarization experiment
(experiments/selfsum.py) compares the context strategies with a trained policy:

    prompt:  "Read key.txt, then 1.log to 4.log. Then reply with the key."
    key.txt: "key #Q"                     (the fact, only ever seen in a tool output)
    k.log:   filler lines ("ok " + 4 lowercase letters); optional decoys "old K revoked"
    answer:  "<final>#Q</final>"          (exact match: a list of candidates scores 0)

The key is one capital letter of `KEY_ALPHABET` (23 letters: R, S and T occur in the
prompts), the only capital of that set in the context unless decoys are on. Carrying it is
then a content lookup one attention head can do ("copy the key-alphabet letter"), wherever
the key sits. A two-digit key ("key #47") needs an induction circuit (the digit *after* "#"):
in the tiny 3-layer MLA byte model it formed after 600-800 clean-SFT steps in some seeds and
not after 1400-1700 in others, and over ~300 tokens less reliably than over ~100
(docs/PERF.md, "Self-summarization"). Decoys (`n_decoys` > 0) are capitals of the same set,
which brings the induction problem back; the self-summarization config has none.

Reading the logs pushes the context past the compaction trigger, so the key's
observation is gone after a compaction: the answer survives only if the summary kept it
(self-summary, prompt compaction) and never under a sliding window (the window drops the
oldest turns first). The env's one tool is `read(path)` (docs/SPEC.md §5 per-environment tool
sets), executed in the sandbox (`cat`). Everything is deterministic in the seed; held-out
tasks are unseen seeds (>= `HELDOUT_SEED_START`).

**Several keys** (`n_keys` > 1, the harder ``key_relay`` family of `horizon.env.families`): keys
2..n arrive later, as a line "key #Z" in logs spread over the run (`late_key_logs`), and the answer
is every key in order of arrival ("#Q #Z #B"). Facts arrive at different times, so with a trigger
that fires every few logs an episode needs >= 2 summaries before the answer, and a later summary
must carry forward what an earlier one held (configs/selfsum_relay.py). With one shared alphabet,
writing them in order is an ordered-list merge (the earliest key not yet written, from an earlier
summary or an observation): in the tiny model the middle slot of a 3-key summary did not form while
the first and last did (docs/PERF.md "Self-summarization study, the harder family").
`slot_alphabets=True` draws key i from the i-th disjoint slice of the alphabet, so each slot is the
same one-head content lookup as the single key; the summary must still carry every earlier key
(whose observation has left the context), which is what the family tests.

**Long horizons** (configs/selfsum_rl.py, docs/SPEC.md §6): up to `MAX_LOGS` logs (>= 12 actions and
several rewrites at the trigger), two more kinds of lines, drawn from their own stream so every other
task is unchanged:

- memos (`n_memos`): "memo #q", a marked lowercase letter in a random log. They look like facts and
  are never needed (`metadata["distractors"]`): a summary that keeps them spends tokens on nothing.
- the pin (`pin_prob` > 0): "pin #P" in one of the first three logs, its letter from a slice of the
  alphabet of its own (`slot_alphabet(..., n_keys + 1, n_keys)`). Whether it matters shows only in the
  last log: with probability `pin_prob` that log says "pin needed", and the answer is then every key
  and the pin ("#Q #Z #B #P"). A summary written before the last log cannot know, so the one that
  never loses the answer keeps the pin.

This module is data and rules only (tasks, the env's tool, the patterns a summary or log line
follows); the demonstrator that acts in the agent loop (`horizon.env.demos.KeyRecallDemoPolicy`)
and the family wiring (`horizon.env.families`) sit above the agent layer.
"""

from __future__ import annotations

import dataclasses
import random
import re
import shlex

from horizon.tasks.synthetic import synthetic_seeds
from horizon.tasks.task import Task
from horizon.tools.registry import Param, Tool, ToolArgError, ToolContext, ToolRegistry

HELDOUT_SEED_START = 1_000_000
WORKSPACE = "/workspace"
KEY_FILE = "key.txt"
KEY_MARK = "#"        # the key is written "#Q": the marker, then one letter of KEY_ALPHABET
KEY_ALPHABET = "ABCDEFGHIJKLMNOPQUVWXYZ"   # capitals not in the prompts (R, S, T are): 1/23 for a guess
SYSTEM_PROMPT = "Tool: read(path)."
PROMPT_TEMPLATE = "Read key.txt, then 1.log to {n}.log. Then reply with the key."
RELAY_PROMPT_TEMPLATE = "Read key.txt, then 1.log to {n}.log. Then reply with every key, in order."
# Short strategy texts for this env (`agent.summary_query` etc.; the defaults in
# horizon.agent.summarize are sized for real models and would dwarf a 400-byte context).
SUMMARY_QUERY = "Summarize."
COMPACTION_SECTIONS = ("request", "concepts", "files", "errors", "solving", "facts", "messages", "pending",
                       "current", "next")
COMPACTION_QUERY = "Summarize in 10 sections: " + ", ".join(f"{i} {s}" for i, s in
                                                            enumerate(COMPACTION_SECTIONS, 1)) + "."
CONDENSER_SECTIONS = ("context", "completed", "pending", "state")    # OpenHands' condenser sections, shortened
CONDENSER_QUERY = "Summarize the older steps: " + ", ".join(CONDENSER_SECTIONS) + "."
MASK_PLACEHOLDER = "(old output omitted)"
CONTEXT_NOTES = {       # `agent.context_notes`: one line per strategy, what happens when the context fills up
    "self_summary": "Context full: you summarize.",
    "prompt_compaction": "Context full: it is compacted.",
    "summarizing_condenser": "Context full: old steps condensed.",
    "observation_masking": "Old tool outputs get omitted.",
    "sliding_window": "Context full: old turns dropped.",
    "none": "",
}
SUMMARY_HEADER = "Summary: "
STATE_TEMPLATE = "State: {summaries} summaries, {turns} turns."
_PATH_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
KEY_RE = re.compile(r"key #([A-Z])")               # "key #Q", in the file and in summaries; not decoys
MEMO_TEMPLATE = "memo #{}"                           # a distractor line (lowercase letter): never needed
PIN_TEMPLATE = "pin #{}"                             # the pin: needed only where the last log says PIN_NEEDED
PIN_NEEDED = "pin needed"
PIN_RE = re.compile(r"pin #([A-Z])")
ANSWER_LETTER_RE = re.compile(r"#([A-Z])")                # the letters of an answer ("#A #G #P"), in slot order
FACT_RE = re.compile(r"key #[A-Z]|pin #[A-Z]|pin needed|memo #[a-z]")   # what a memory may carry, in order
MEMO_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
MAX_LOGS = 16
DECOY_TEMPLATE = "old {} revoked"                   # a decoy log line: written by `_log`, read by the demonstrator
DECOY_RE = re.compile(re.escape(DECOY_TEMPLATE).replace(r"\{\}", "([A-Z])"))
LAST_RE = re.compile(r"(?:last|current:) (\d+)\.log")
READ_RE = re.compile(r"<parameter=path>(?:/workspace/)?(\d+)\.log</parameter>")
_ID_RE = re.compile(r"keyrecall_(\d+)")
_FILLER = "abcdefghijklmnop"


def _check_alphabet(alphabet: str, n_decoys: int = 0) -> None:
    if (not alphabet or len(set(alphabet)) != len(alphabet) or not all("A" <= ch <= "Z" for ch in alphabet)
            or len(alphabet) < n_decoys + 1):
        raise ValueError(f"key_alphabet must be distinct capitals A-Z with room for {n_decoys} decoys, "
                         f"got {alphabet!r}")


def key_recall_seeds(split: str, n: int, start: int = 0) -> list[int]:
    """`n` consecutive seeds of `split` from offset `start` (train and held-out ranges are disjoint)."""
    return synthetic_seeds(split, n, start, heldout_seed_start=HELDOUT_SEED_START)


def _log(rng: random.Random, n_lines: int, decoy: str | None, key: str | None = None) -> str:
    lines = ["ok " + "".join(rng.choice(_FILLER) for _ in range(4)) for _ in range(n_lines)]
    if decoy is not None:
        lines.insert(rng.randrange(n_lines + 1), DECOY_TEMPLATE.format(decoy))
    if key is not None:                      # a late key (n_keys > 1): the same line as key.txt's
        lines.insert(rng.randrange(len(lines) + 1), f"key {KEY_MARK}{key}")
    return "\n".join(lines) + "\n"


def late_key_logs(n_logs: int, n_keys: int) -> list[int]:
    """The logs that hold keys 2..n_keys: spread evenly, the last in the last log (key 1 is key.txt)."""
    return [round(i * n_logs / (n_keys - 1)) for i in range(1, n_keys)] if n_keys > 1 else []


def slot_alphabet(key_alphabet: str, n_keys: int, i: int) -> str:
    """The i-th (0-based) of `n_keys` contiguous, disjoint slices of `key_alphabet` (`slot_alphabets`)."""
    k, r = divmod(len(key_alphabet), n_keys)
    lo = i * k + min(i, r)
    return key_alphabet[lo:lo + k + (i < r)]


def make_key_recall_task(seed: int, *, n_logs: int = 4, log_lines: int = 6, n_decoys: int = 2,
                         key_alphabet: str = KEY_ALPHABET, n_keys: int = 1, slot_alphabets: bool = False,
                         n_memos: int = 0, pin_prob: float = 0.0) -> Task:
    """The deterministic key-recall task for `seed` (module docstring); `n_keys` > 1: keys 2..n
    in the logs of `late_key_logs`, the answer every key in order. `slot_alphabets`: key i is a
    letter of the i-th disjoint slice of `key_alphabet` (`slot_alphabet`), so which slot a letter
    fills is in the letter itself (module docstring, "Several keys"); no decoys with it. `n_memos`
    distractor lines and a pin needed with probability `pin_prob` ("Long horizons"; the pin needs
    `slot_alphabets`)."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if (not 1 <= n_logs <= MAX_LOGS or log_lines < 1 or not 0 <= n_decoys <= n_logs or not 1 <= n_keys <= n_logs + 1
            or not 0 <= n_memos <= len(MEMO_ALPHABET) or not 0.0 <= pin_prob <= 1.0):
        raise ValueError(f"bad sizes: n_logs={n_logs} (1..{MAX_LOGS}), log_lines={log_lines} (>=1), "
                         f"n_decoys={n_decoys} (0..n_logs), n_keys={n_keys} (1..n_logs+1), "
                         f"n_memos={n_memos} (0..26), pin_prob={pin_prob} (0..1)")
    if pin_prob > 0 and not slot_alphabets:
        raise ValueError("pin_prob > 0 needs slot_alphabets=True (the pin's letter has a slice of its own)")
    if len(key_alphabet) < n_keys + n_decoys:
        raise ValueError(f"key_alphabet {key_alphabet!r} has no room for {n_keys} keys and {n_decoys} decoys")
    _check_alphabet(key_alphabet, n_decoys)
    if slot_alphabets and (n_keys < 2 or n_decoys):
        raise ValueError(f"slot_alphabets needs n_keys >= 2 and no decoys, got n_keys={n_keys}, n_decoys={n_decoys}")
    rng = random.Random(f"key-recall-{seed}")
    if slot_alphabets:
        slots = n_keys + (pin_prob > 0)
        keys = [rng.choice(slot_alphabet(key_alphabet, slots, i)) for i in range(n_keys)]
        task = _task(seed, rng, n_logs, log_lines, keys, [], {})
        if n_memos or pin_prob > 0:
            task = _long_horizon(task, random.Random(f"key-relay-extra-{seed}"), n_memos, pin_prob,
                                 slot_alphabet(key_alphabet, slots, n_keys) if pin_prob > 0 else "")
        return task
    key = rng.choice(key_alphabet)
    decoys = rng.sample([k for k in key_alphabet if k != key], n_decoys)
    decoy_at = dict(zip(rng.sample(range(1, n_logs + 1), n_decoys), decoys))
    late = rng.sample([k for k in key_alphabet if k != key and k not in decoys], n_keys - 1) if n_keys > 1 else []
    return _task(seed, rng, n_logs, log_lines, [key] + late, decoys, decoy_at)


def _task(seed: int, rng: random.Random, n_logs: int, log_lines: int, keys: list[str], decoys: list[str],
          decoy_at: dict) -> Task:
    n_keys, key = len(keys), keys[0]
    late_at = dict(zip(late_key_logs(n_logs, n_keys), keys[1:]))
    files = {KEY_FILE: f"key {KEY_MARK}{key}\n"}
    files.update({f"{i}.log": _log(rng, log_lines, decoy_at.get(i), late_at.get(i)) for i in range(1, n_logs + 1)})
    solution = tuple({"name": "read", "args": {"path": p}} for p in [KEY_FILE] + [f"{i}.log"
                                                                                  for i in range(1, n_logs + 1)])
    answer = " ".join(f"{KEY_MARK}{k}" for k in keys)
    template = PROMPT_TEMPLATE if n_keys == 1 else RELAY_PROMPT_TEMPLATE
    return Task(id=f"keyrecall_{seed}" if n_keys == 1 else f"keyrelay{n_keys}_{seed}", prompt=template.format(n=n_logs),
                files=files, test_cmd="", reward_mode="answer", solution=solution, final_answer=answer,
                should_edit=False, kind="recall", split="heldout" if seed >= HELDOUT_SEED_START else "train",
                metadata={"source": "key_recall", "seed": seed, "key": key, "keys": keys, "decoys": decoys,
                          "n_logs": n_logs, "expected": [[answer]], "answer_match": "exact",
                          "facts": [f"key {KEY_MARK}{k}" for k in keys]})


def _insert_line(rng: random.Random, text: str, line: str) -> str:
    lines = text.splitlines()
    lines.insert(rng.randrange(len(lines) + 1), line)
    return "\n".join(lines) + "\n"


def _long_horizon(task: Task, rng: random.Random, n_memos: int, pin_prob: float, pin_alphabet: str) -> Task:
    """`task` with memos and the pin added ("Long horizons"): the same files otherwise, the answer
    extended by the pin where the last log asks for it; `metadata["facts"]` lists what the answer
    needs, `metadata["distractors"]` the memos."""
    n = int(task.metadata["n_logs"])
    files, meta = dict(task.files), dict(task.metadata)
    memos = rng.sample(MEMO_ALPHABET, n_memos)
    for m in memos:
        name = f"{rng.randrange(1, n + 1)}.log"
        files[name] = _insert_line(rng, files[name], MEMO_TEMPLATE.format(m))
    answer, facts, pin, needed = task.final_answer, list(meta["facts"]), None, False
    if pin_alphabet:
        pin, needed = rng.choice(pin_alphabet), rng.random() < pin_prob
        name = f"{rng.randrange(1, min(3, n) + 1)}.log"
        files[name] = _insert_line(rng, files[name], PIN_TEMPLATE.format(pin))
        if needed:
            files[f"{n}.log"] = _insert_line(rng, files[f"{n}.log"], PIN_NEEDED)
            answer, facts = f"{answer} {KEY_MARK}{pin}", facts + [PIN_TEMPLATE.format(pin)]
    meta.update(expected=[[answer]], facts=facts, distractors=[MEMO_TEMPLATE.format(m) for m in memos],
                pin=pin, pin_needed=needed)
    return dataclasses.replace(task, files=files, final_answer=answer, metadata=meta)


def key_recall_task_from_id(task_id: str, **kw) -> Task:
    m = _ID_RE.fullmatch(task_id)
    if not m:
        raise ValueError(f"not a key-recall task id: {task_id!r} (expected keyrecall_<seed>)")
    return make_key_recall_task(int(m.group(1)), **kw)


# ----------------------------------------------------------------------------- the env's tool
def read_file_tool(ctx: ToolContext, path: str) -> str:
    """`read(path)`: the file's text (one `cat` in the sandbox). Paths are workspace-relative
    names (a leading /workspace/ is accepted)."""
    name = path.strip().removeprefix(WORKSPACE + "/")
    if not _PATH_RE.match(name) or name.startswith("."):
        raise ToolArgError(f"path must be a file name in {WORKSPACE}, got {path[:40]!r}")
    res = ctx.sandbox.exec(f"cat -- {shlex.quote(WORKSPACE + '/' + name)}", timeout=ctx.timeout_s, workdir="/")
    if res.exit_code != 0:
        raise ToolArgError(f"no file {name}")
    return res.output


READ_TOOL = Tool("read", "Print a file of /workspace.", (Param("path", "str", True, "file name, e.g. 1.log"),),
                 read_file_tool)


def key_recall_registry(strict: bool = True) -> ToolRegistry:
    return ToolRegistry([READ_TOOL], strict=strict)


def n_logs_of(text: str) -> int:
    """The number of logs a key-recall prompt asks for (0 if `text` holds no such prompt)."""
    m = re.search(r"then 1\.log to (\d+)\.log", text)
    return int(m.group(1)) if m else 0
