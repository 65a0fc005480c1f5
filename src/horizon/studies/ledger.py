"""The committed study ledger (docs/SPEC.md §7, §7.2): one JSON row per held-out evaluation episode,
appended to ``docs/results/<study>.jsonl``, from which docs/RESULTS.md is rebuilt
(experiments/results.py, `horizon.studies.results_md`).

The ledger is append-only so a study can be resumed and extended across sessions (more seeds, a
rerun of one strategy): a row's identity is its schema's key fields (`row_key`), and `read_rows`
keeps the last row of each identity, so a rerun replaces its earlier rows and nothing is counted
twice.

Rows follow one of `SCHEMAS`, named by the row's ``schema`` field (absent: ``selfsum``).

A ``selfsum`` row holds, all required (`validate_row`): study, trigger (the compaction trigger in tokens),
seed, strategy, phase (`PHASES`: the post-SFT policy, the post-RL policy, and the post-SFT policy
with the demonstrator's perfect summaries injected), task_id, pass_index, solved, summaries,
summary_tokens, generated_tokens, compaction_error, needed_seen / needed_kept (needed facts the
context held before a compaction / those the memory kept after it), distractors_seen /
distractors_kept (the same for distractor facts), and provenance (`horizon.utils.provenance`).

A ``swe`` row (the real-repository pipeline, docs/REAL_REPOS.md; `horizon.studies.swe_results`)
holds: schema, study, seed, phase (`SWE_PHASES`: the post-SFT or the post-RL policy), split (unseen
instances of the train repositories, or the held-out repositories), task_id, repo, bug_kind,
pass_index, solved, turns, tool_calls, malformed_calls, summaries, failure_mode, right_file,
right_hunk and provenance.

An ``arm`` row (an RL run of a study whose arms are runs, `horizon.studies.arms`) holds: schema, study,
seed, arm, phase (`SWE_PHASES`: step 0's SFT policy, the post-RL policy), step, task_id, pass_index,
solved, completion_tokens, tool_calls, turns, train (the run's training diagnostics) and provenance; newer rows
also parallel_calls (the calls made in multi-call turns).

Extra fields (e.g. ``run_wall_s``, ``command``) are allowed and kept.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import pathlib
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from horizon.eval.report import read_jsonl
from horizon.utils.provenance import REPO

KEY_FIELDS = ("study", "trigger", "seed", "strategy", "phase", "task_id", "pass_index")
PHASES = ("sft", "rl", "oracle")
RESULTS_DIR = "docs/results"        # relative to the repository root: <study>.jsonl and <study>.md notes

COUNTS = ("summaries", "summary_tokens", "generated_tokens", "needed_seen", "needed_kept", "distractors_seen",
          "distractors_kept")
FIELDS: dict[str, str] = dict(
    study="str", trigger="int", seed="int", strategy="str", phase="str", task_id="str", pass_index="int",
    solved="bool", **{k: "int" for k in COUNTS[:3]}, compaction_error="bool", **{k: "int" for k in COUNTS[3:]},
    provenance="dict")


def ledger_path(study: str, root: str | pathlib.Path = REPO) -> pathlib.Path:
    """Where `study`'s ledger lives under the repository `root`."""
    return pathlib.Path(root) / RESULTS_DIR / f"{study}.jsonl"


def _is(v, kind: str) -> bool:
    if kind == "bool":
        return isinstance(v, (bool, np.bool_))
    if kind == "int":        # a bool is an int to Python, never to the ledger
        return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
    return isinstance(v, {"str": str, "dict": dict}[kind])


def _kept_within_seen(row: dict) -> None:
    for kind in ("needed", "distractors"):
        if row[f"{kind}_kept"] > row[f"{kind}_seen"]:
            raise ValueError(f"field '{kind}_kept' ({row[f'{kind}_kept']}) exceeds {kind}_seen "
                             f"({row[f'{kind}_seen']})")


def _calls_within_turns(row: dict) -> None:
    if row["malformed_calls"] + row["tool_calls"] > row["turns"]:
        raise ValueError(f"fields 'tool_calls' + 'malformed_calls' ({row['tool_calls']} + {row['malformed_calls']}) "
                         f"exceed turns ({row['turns']})")


@dataclasses.dataclass(frozen=True)
class Schema:
    """One kind of ledger row: its required fields and their types, its identity, its phases, the
    counts that cannot be negative, and a cross-field check."""

    fields: dict[str, str]
    key_fields: tuple[str, ...]
    phases: tuple[str, ...]
    counts: tuple[str, ...]
    check: Callable[[dict], None] | None = None


SWE_PHASES = ("sft", "rl")
SWE_SPLITS = ("unseen", "heldout")
SWE_COUNTS = ("pass_index", "turns", "tool_calls", "malformed_calls", "summaries")
ARM_COUNTS = ("pass_index", "step", "completion_tokens", "tool_calls", "turns")


def _calls_within_episode(row: dict) -> None:
    """One call per turn, but for the calls of multi-call turns (``parallel_calls``, optional: docs/SPEC.md §5)."""
    par = row.get("parallel_calls", 0)
    if not (isinstance(par, int) and 0 <= par <= row["tool_calls"]):
        raise ValueError(f"field 'parallel_calls' ({par!r}) must be an int in [0, tool_calls={row['tool_calls']}]")
    if row["tool_calls"] - par > row["turns"]:
        extra = f" less its {par} parallel calls" if par else ""
        raise ValueError(f"field 'tool_calls' ({row['tool_calls']}){extra} exceeds turns ({row['turns']})")
SCHEMAS = {
    "selfsum": Schema(FIELDS, KEY_FIELDS, PHASES, ("trigger", "pass_index", *COUNTS), _kept_within_seen),
    "swe": Schema(dict(schema="str", study="str", seed="int", phase="str", split="str", task_id="str", repo="str",
                       bug_kind="str", solved="bool", **{k: "int" for k in SWE_COUNTS}, failure_mode="str",
                       right_file="bool", right_hunk="bool", provenance="dict"),
                  ("schema", "study", "seed", "phase", "split", "task_id", "pass_index"), SWE_PHASES, SWE_COUNTS,
                  _calls_within_turns),
    "arm": Schema(dict(schema="str", study="str", seed="int", arm="str", phase="str", step="int", task_id="str",
                       pass_index="int", solved="bool", **{k: "int" for k in ARM_COUNTS[2:]}, train="dict",
                       provenance="dict"),
                  ("schema", "study", "seed", "arm", "phase", "task_id", "pass_index"), SWE_PHASES, ARM_COUNTS,
                  _calls_within_episode),
}


def schema_of(row: dict) -> Schema:
    """The `Schema` a row follows (its ``schema`` field; ``selfsum`` without one)."""
    name = row.get("schema", "selfsum")
    if name not in SCHEMAS:
        raise ValueError(f"field 'schema' must be one of {tuple(SCHEMAS)}, got {name!r}")
    return SCHEMAS[name]


def validate_row(row: dict) -> None:
    """Raise a one-line ValueError naming the first bad field of `row` (`schema_of`'s layout):
    missing, of the wrong type, an unknown phase, a negative count, or counts that contradict each
    other (more facts kept than seen; more calls than turns)."""
    if not isinstance(row, dict):
        raise ValueError(f"a ledger row must be a dict, got {type(row).__name__}")
    sc = schema_of(row)
    for k, kind in sc.fields.items():
        if k not in row:
            raise ValueError(f"field {k!r} is missing")
        if not _is(row[k], kind):
            raise ValueError(f"field {k!r} must be {kind}, got {type(row[k]).__name__} {row[k]!r:.60}")
    if row["phase"] not in sc.phases:
        raise ValueError(f"field 'phase' must be one of {sc.phases}, got {row['phase']!r}")
    for k in sc.counts:
        if row[k] < 0:
            raise ValueError(f"field {k!r} must be >= 0, got {row[k]}")
    if sc.check is not None:
        sc.check(row)


def row_key(row: dict) -> tuple:
    """A row's identity (its schema's key fields): two rows with one key are one episode, run twice."""
    return (row.get("schema", "selfsum"), *(row[k] for k in schema_of(row).key_fields))


def _plain(x):
    """JSON for numpy scalars (a row may carry np.int64 counts or np.bool_ flags)."""
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def append_rows(path: str | pathlib.Path, rows: Iterable[dict]) -> int:
    """Validate every row of `rows`, then append them to the JSONL `path` (parents created): one bad
    row writes nothing, so a ledger never holds half a batch. Returns the number of rows appended."""
    rows = list(rows)
    for i, r in enumerate(rows):
        try:
            validate_row(r)
        except ValueError as e:
            raise ValueError(f"row {i}: {e}") from None
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, sort_keys=True, default=_plain) + "\n" for r in rows)
    with path.open("a") as f:
        f.write(text)
    return len(rows)


def dedupe(rows: Sequence[dict]) -> list[dict]:
    """`rows` with one row per `row_key`: the last one, at the place its key first appeared (a rerun
    replaces the earlier episode and keeps the table's order)."""
    out: dict[tuple, dict] = {}
    for r in rows:
        out[row_key(r)] = r
    return list(out.values())


def read_rows(path: str | pathlib.Path) -> list[dict]:
    """The validated rows of the ledger `path`, last row winning per identity (`dedupe`)."""
    rows = read_jsonl(path)
    for i, r in enumerate(rows, 1):
        try:
            validate_row(r)
        except ValueError as e:
            raise ValueError(f"{path}: row {i}: {e}") from None
    return dedupe(rows)


def episode_rows(episodes: Sequence[dict], *, study: str, trigger: int, phase: str, strategy: str,
                 provenance: dict, **extra) -> list[dict]:
    """Ledger rows of a study eval's per-episode records (`horizon.studies.selfsum.episode_record`
    plus `pass_index`): the record's fields, the row identity (`study`, `trigger`, `phase`, and
    `strategy`: the arm's strategy, whatever the record's run was called) and `provenance`; `extra`
    (e.g. ``command``) on every row. Validated on append."""
    return [dict(e, **extra, study=study, trigger=int(trigger), phase=phase, strategy=strategy,
                 provenance=provenance) for e in episodes]
