"""Synthetic long-horizon recall tasks (docs/SPEC.md §5, §6: self-summarization must keep facts).

Each task is deterministic in its seed. The key fact (a "signing code") sits in
notes/KEY.txt, which the prompt says to read first (or in the prompt itself with
`key_in_prompt=True`). Then come `n_filler_files` log shards of ~`filler_bytes` each that
the scripted solution reads one by one, so the tool outputs alone exceed a summarization
trigger; some shards mention revoked *decoy* codes, so a lossy summary that kept "a code"
but not *the* code fails. Exactly one shard reports `STATUS: CORRUPT`. The answer needs
both the early fact and the late finding: the code and the corrupt shard's path, written
to /workspace/ANSWER.txt and/or said in the final message (reward_mode "answer").

Splits by seed range: seeds < `HELDOUT_SEED_START` are "train", the rest "heldout".
Task ids: `recall_<seed>` for default sizes, `recall_<seed>_n<files>_b<bytes>_d<decoys>`
otherwise, plus `_k` when the key is in the prompt; `get_task` rebuilds a task from its id.
"""

from __future__ import annotations

import math
import random
import re

from horizon.tasks.task import Task

HELDOUT_SEED_START = 100_000
DEFAULT_N_FILLER_FILES = 12
DEFAULT_FILLER_BYTES = 4096     # per shard; under the tools' default 8 KiB observation cap
DEFAULT_N_DECOYS = 2
KEY_PATH = "notes/KEY.txt"
ANSWER_PATH = "ANSWER.txt"
_ID_RE = re.compile(r"recall_(\d+)(?:_n(\d+)_b(\d+)_d(\d+))?(_k)?")

_WORDS = ("amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
          "kestrel", "lumen", "maple", "nimbus", "onyx", "pepper", "quartz", "raven", "saffron", "tundra",
          "umber", "violet", "willow", "xenon", "yarrow", "zephyr")
_PROJECTS = ("atlas", "beacon", "comet", "drift", "echo", "forge", "glide", "helix", "ion", "jolt")
_COMPONENTS = ("api", "auth", "billing", "cache", "db", "queue", "scheduler", "search", "storage", "web")
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
_MESSAGES = ("request served", "cache miss", "retrying connection", "slow query", "token refreshed",
             "job scheduled", "worker started", "heartbeat ok", "rate limit near", "flushed buffer",
             "config reloaded", "session expired", "payload validated", "index rebuilt")


def _code(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}-{rng.randrange(1000, 10000)}"


def _shard(rng: random.Random, name: str, n_bytes: int, status: str, decoy: str | None) -> str:
    lines = [f"# log shard {name}"]
    size = len(lines[0]) + 1
    decoy_at = rng.randrange(max(1, min(12, n_bytes // 80))) if decoy else -1
    i = 0
    while size < n_bytes or i <= decoy_at:
        if i == decoy_at:
            line = f"NOTICE old signing code {decoy} was revoked; do not use it"
        else:
            line = (f"2024-03-{rng.randrange(1, 29):02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:"
                    f"{rng.randrange(60):02d} {rng.choice(_LEVELS):5s} {rng.choice(_COMPONENTS)}: "
                    f"{rng.choice(_MESSAGES)} id={rng.getrandbits(48):012x} ms={rng.randrange(1, 900)}")
        lines.append(line)
        size += len(line) + 1
        i += 1
    lines.append(f"STATUS: {status}")
    return "\n".join(lines) + "\n"


def recall_split(seed: int, heldout_seed_start: int = HELDOUT_SEED_START) -> str:
    return "heldout" if seed >= heldout_seed_start else "train"


def recall_seeds(split: str, n: int, start: int = 0, heldout_seed_start: int = HELDOUT_SEED_START) -> list[int]:
    """`n` consecutive seeds of `split` ("train" or "heldout"), from offset `start` in that range."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    first = start if split == "train" else heldout_seed_start + start
    seeds = list(range(first, first + n))
    if split == "train" and seeds and seeds[-1] >= heldout_seed_start:
        raise ValueError(f"train recall seeds must stay below {heldout_seed_start}")
    return seeds


def make_recall_task(seed: int, *, n_filler_files: int = DEFAULT_N_FILLER_FILES,
                     filler_bytes: int = DEFAULT_FILLER_BYTES, n_decoys: int = DEFAULT_N_DECOYS,
                     key_in_prompt: bool = False, heldout_seed_start: int = HELDOUT_SEED_START) -> Task:
    """A deterministic long-horizon recall task for `seed` (see module docstring)."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if n_filler_files < 1 or filler_bytes < 64 or not 0 <= n_decoys <= n_filler_files:
        raise ValueError(f"bad recall sizes: n_filler_files={n_filler_files} (>=1), filler_bytes={filler_bytes} "
                         f"(>=64), n_decoys={n_decoys} (0..n_filler_files)")
    rng = random.Random(f"horizon-recall-{seed}")   # str seeds hash deterministically (sha512)
    code = _code(rng)
    decoys = []
    while len(decoys) < n_decoys:
        c = _code(rng)
        if c != code and c not in decoys:
            decoys.append(c)
    project = rng.choice(_PROJECTS)
    width = max(2, len(str(n_filler_files - 1)))
    names = [f"data/shard_{i:0{width}d}.log" for i in range(n_filler_files)]
    corrupt = rng.randrange(n_filler_files)
    decoy_shards = dict(zip(rng.sample(range(n_filler_files), n_decoys), decoys))
    files = {}
    for i, name in enumerate(names):
        files[name] = _shard(rng, name, filler_bytes, "CORRUPT checksum mismatch" if i == corrupt else "OK",
                             decoy_shards.get(i))
    key_text = (f"Release notes for project {project}.\n\n"
                f"The current release signing code is: {code}\n"
                "You will need it at the end of the shard audit. Older codes in the logs are revoked.\n")
    if key_in_prompt:
        files[KEY_PATH] = f"Release notes for project {project}.\n(the signing code was given to you directly)\n"
        lead = f"The current release signing code is {code}; remember it. "
    else:
        files[KEY_PATH] = key_text
        lead = f"Read {KEY_PATH} first. "
    prompt = (f"{lead}Then audit every log shard in data/ ({n_filler_files} files), reading each one, and find "
              "the shard whose STATUS line says CORRUPT. When done, write the current signing code and the "
              f"corrupt shard's path, one per line, to /workspace/{ANSWER_PATH}.")
    answer = f"{code}\n{names[corrupt]}\n"
    solution = [{"name": "read_file", "args": {"path": f"/workspace/{KEY_PATH}"}},
                {"name": "list_dir", "args": {"path": "/workspace/data"}}]
    solution += [{"name": "read_file", "args": {"path": f"/workspace/{n}"}} for n in names]
    solution.append({"name": "edit_file", "args": {"command": "create", "path": f"/workspace/{ANSWER_PATH}",
                                                   "file_text": answer}})
    defaults = (n_filler_files, filler_bytes, n_decoys) == (DEFAULT_N_FILLER_FILES, DEFAULT_FILLER_BYTES,
                                                            DEFAULT_N_DECOYS)
    task_id = f"recall_{seed}" if defaults else f"recall_{seed}_n{n_filler_files}_b{filler_bytes}_d{n_decoys}"
    task_id += "_k" if key_in_prompt else ""
    return Task(
        id=task_id, prompt=prompt, files=files, test_cmd="", reward_mode="answer", image=None,
        solution=tuple(solution),
        final_answer=f"The signing code is {code} and the corrupt shard is {names[corrupt]}; both are in "
                     f"/workspace/{ANSWER_PATH}.",
        should_edit=True, kind="recall", split=recall_split(seed, heldout_seed_start),
        metadata={"seed": seed, "code": code, "decoys": decoys, "corrupt_file": names[corrupt],
                  "expected": [[code], [names[corrupt], names[corrupt].rsplit("/", 1)[-1]]],
                  "key_in_prompt": key_in_prompt, "filler_files": names,
                  "filler_bytes_total": sum(len(files[n].encode()) for n in names)},
    )


def filler_volume(task: Task) -> int:
    """Bytes of filler a recall task's solution reads (~tokens for the byte tokenizer)."""
    return int(task.metadata["filler_bytes_total"])


def make_recall_task_for_trigger(seed: int, trigger_tokens: int, *, margin: float = 2.0,
                                 filler_bytes: int = DEFAULT_FILLER_BYTES, bytes_per_token: float = 1.0,
                                 **kwargs) -> Task:
    """A recall task whose filler is at least `margin` x `trigger_tokens` (so >= 1 summary fires).

    `bytes_per_token` converts bytes to tokens (1.0 for the byte tokenizer; ~3-4 for BPE).
    """
    if trigger_tokens <= 0 or margin <= 0 or bytes_per_token <= 0:
        raise ValueError(f"bad trigger sizing: trigger_tokens={trigger_tokens} margin={margin} "
                         f"bytes_per_token={bytes_per_token}")
    n = max(1, math.ceil(margin * trigger_tokens * bytes_per_token / filler_bytes))
    return make_recall_task(seed, n_filler_files=n, filler_bytes=filler_bytes, **kwargs)


def is_recall_id(task_id: str) -> bool:
    return _ID_RE.fullmatch(task_id) is not None


def recall_task_from_id(task_id: str) -> Task:
    m = _ID_RE.fullmatch(task_id)
    if m is None:
        raise KeyError(f"{task_id!r} is not a recall task id (recall_<seed>[_n<files>_b<bytes>_d<decoys>])")
    seed, key_in_prompt = int(m.group(1)), m.group(5) is not None
    if m.group(2) is None:
        return make_recall_task(seed, key_in_prompt=key_in_prompt)
    return make_recall_task(seed, n_filler_files=int(m.group(2)), filler_bytes=int(m.group(3)),
                            n_decoys=int(m.group(4)), key_in_prompt=key_in_prompt)
