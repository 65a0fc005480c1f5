"""Parallel tool calls after RL vs their rate in the SFT demonstrations (docs/SPEC.md §5): configs/parallel_calls.py
with demos that read two logs in one turn at rate p = 0 and p = 0.1, each arm from its own SFT checkpoint (made by
the arm's run if missing), RL with a turn cost; the ledger's section shows the parallel-call rate after SFT and
after RL per arm (docs/RESULTS.md "parallel_calls").

    python experiments/sweep.py --sweep=configs/sweeps/parallel_calls.py
"""

SCRIPT = "experiments/rl.py"
CONFIG = "configs/parallel_calls.py"
OUT_FIELD = "exp.out_dir"
BASE_OVERRIDES = {"seed": 0, "exp.ledger": "docs/results/parallel_calls.jsonl"}
PLOT = ("step", "reward_mean")
RATES = (0.0, 0.1)


def get_sweep() -> list[dict]:
    return [{"exp.sft.parallel_prob": p, "exp.sft.init_from": f"runs/parallel_calls_sft/p{p}/sft",
             "exp.arm": f"parallel demos: p={p}"} for p in RATES]
