"""The length penalty's effect on effort at equal success (docs/SPEC.md §4.2): configs/rl_keyrecall.py (reads, a
self-summary, the answer: effort varies with the tokens, calls and turns an episode spends) with the penalty off,
the report's concave shape (q = 0.5) at three strengths, and a linear penalty (q = 0) of the middle strength's
mean; every arm from one SFT checkpoint (`exp.sft.init_from`, made by the first run if missing). The ledger's
section shows success and tokens / tool calls / turns per solved episode after RL per arm (docs/RESULTS.md
"length_penalty").

    python experiments/sweep.py --sweep=configs/sweeps/length_penalty.py

Strengths are set against the demonstrator's mean effort on this family, X_BAR (`rl.length_penalty.weights`
as configured): `benchmarks/selfsum_family.py --config=configs/rl_keyrecall.py` printed 471.3 (self_summary,
24 held-out tasks); the SFT policy imitates that demonstrator. A strength is the mean penalty at X_BAR.
"""

import math

SCRIPT = "experiments/rl.py"
CONFIG = "configs/rl_keyrecall.py"
OUT_FIELD = "exp.out_dir"
SFT = "runs/rl_keyrecall_sft/sft"
BASE_OVERRIDES = {"exp.sft.init_from": SFT, "seed": 0, "exp.ledger": "docs/results/length_penalty.jsonl"}
PLOT = ("step", "reward_mean")
X_BAR = 471.3                 # the demonstrator's mean effort (module docstring)
K, Q = 1e-3, 0.5              # configs/rl_tiny.py's concave curve (horizon.env.rewards.penalty_curve)
STRENGTHS = (0.05, 0.1, 0.2)  # mean penalty at X_BAR; a solved episode's reward is 1
LINEAR_OF = 0.1               # the linear arm matches this strength's mean


def curve(x: float, k: float, q: float) -> float:
    """f(x; k, q) for q < 1 (horizon.env.rewards.penalty_curve; q = 0 is x itself)."""
    return math.expm1((1.0 - q) * math.log1p(k * x)) / (k * (1.0 - q))


def get_sweep() -> list[dict]:
    off = {"rl.length_penalty.enabled": False, "exp.arm": "length penalty: off"}
    concave = [{"rl.length_penalty.enabled": True, "rl.length_penalty.q": Q, "rl.length_penalty.k": K,
                "rl.length_penalty.scale": s / curve(X_BAR, K, Q), "exp.arm": f"length penalty: concave {s}"}
               for s in STRENGTHS]
    linear = {"rl.length_penalty.enabled": True, "rl.length_penalty.q": 0.0, "rl.length_penalty.k": K,
              "rl.length_penalty.scale": LINEAR_OF / X_BAR, "exp.arm": f"length penalty: linear {LINEAR_OF}"}
    return [off, *concave, linear]
