"""The RL self-summarization study's runs per seed (docs/RESULTS.md; experiments/selfsum.py).

An *arm* is one strategy at one compaction trigger: every strategy of `exp.strategies` at the
config's `agent.trigger_tokens`, and on the first seed each of `exp.triggers` too (the post's two
trigger lengths, from the same SFT checkpoint). Per arm the driver evaluates the SFT policy (step 0
of `loop.run_rl`), the oracle-summary policy (`oracle_eval`: the same policy, the same eval key,
with the demonstrator's perfect summaries injected, `horizon.studies.oracle`), runs RL and
evaluates again; `ledger_rows` turns the three evals' episodes into rows of the study's committed
JSONL (`horizon.studies.ledger`), appended as each arm finishes so a killed study loses at most
the arm it was in.
"""

from __future__ import annotations

import copy
import pathlib
from typing import NamedTuple

from horizon.studies import ledger
from horizon.studies.oracle import OracleSummaries
from horizon.studies.selfsum import study_eval
from horizon.utils.provenance import REPO


class Arm(NamedTuple):
    name: str          # the run's name in metrics.jsonl and the study table ("self_summary@100" off the default)
    strategy: str
    trigger: int


def arms(c, seed: int) -> list[Arm]:
    """The arms of `seed` (module docstring): the default trigger for every seed, `exp.triggers` on
    the first of `exp.seeds` only."""
    base = int(c.agent.trigger_tokens)
    out = [Arm(s, s, base) for s in c.exp.strategies]
    if int(seed) == int(tuple(c.exp.seeds)[0]):
        out += [Arm(f"{s}@{t}", s, int(t)) for t in c.exp.get("triggers", ()) if int(t) != base
                for s in c.exp.strategies]
    return out


def with_arm(c, arm: Arm):
    """A copy of `c` whose agent runs `arm`'s strategy at its trigger."""
    cs = copy.deepcopy(c)
    cs.agent.context_strategy = arm.strategy
    cs.agent.trigger_tokens = int(arm.trigger)
    return cs


def oracle_eval(params, env, tasks, c, tok, *, strategy: str, policy_fn) -> dict:
    """`study_eval` of the SFT policy (`policy_fn(params, 0)`: the step-0 eval's policy and key) with
    perfect summaries injected; `oracle_summaries` counts the injected turns."""
    pol = OracleSummaries(policy_fn(params, 0), tok, seed=int(c.seed))
    out = study_eval(pol, env, tasks, c, tok, strategy=strategy, seed=int(c.seed))
    return dict(out, oracle_summaries=pol.injected)


def ledger_file(c) -> pathlib.Path | None:
    """The study's ledger: `exp.ledger` (relative to the repository root), `<out_dir>/ledger.jsonl`
    where it is "" (the quick variant: its rows stay out of the committed file), None without a study name."""
    if not c.exp.get("study"):
        return None
    path = str(c.exp.get("ledger") or "")
    return REPO / path if path else pathlib.Path(c.exp.out_dir) / "ledger.jsonl"


def ledger_rows(c, arm: Arm, evals: dict, provenance: dict, **extra) -> list[dict]:
    """Rows of an arm's evals ({phase: eval with `episodes`}, phases of `ledger.PHASES`)."""
    return [r for phase, ev in evals.items() if ev is not None
            for r in ledger.episode_rows(ev["episodes"], study=str(c.exp.study), trigger=arm.trigger, phase=phase,
                                         strategy=arm.strategy, provenance=provenance, **extra)]


def record_arm(c, arm: Arm, result: dict, book, provenance: dict, **extra) -> int:
    """Append an arm's rows (`result`: `selfsum.logged_results`' start, end and oracle evals) to the
    ledger `book` unless it already holds rows of this study, seed, strategy and trigger: a rerun of
    a killed study records an arm it finished but had not recorded, and never an arm twice."""
    have = {(r["seed"], r["strategy"], r["trigger"]) for r in ledger.read_rows(book)} if book.exists() else set()
    if (int(c.seed), arm.strategy, arm.trigger) in have:
        return 0
    evals = dict(sft=result["start"], rl=result["end"], oracle=result.get("oracle"))
    return ledger.append_rows(book, ledger_rows(c, arm, evals, provenance, **extra))
