"""Router replay under a sampler/trainer mismatch (docs/SPEC.md §4.1): make run's RL with a bf16 rollout engine
whose router logits carry noise at three levels (`rl.sampler.router_noise`), each trained with no replay, with
replay, and with replay + the gate-score plausibility filter (`model.replay_plausibility_ratio`); every arm
starts from one SFT checkpoint (`exp.sft.init_from`, made by the first run if missing).

    python experiments/sweep.py --sweep=configs/sweeps/router_replay.py

The per-token view of the same mismatch (gap p50 / p99, routing disagreement, replay on and off):
benchmarks/router_mismatch.py with the same checkpoint and noise levels (docs/RESULTS.md "router_replay").
"""

SCRIPT = "experiments/rl.py"
CONFIG = "configs/rl_tiny.py"
OUT_FIELD = "exp.out_dir"
SFT = "runs/rl_tiny_sft/sft"
BASE_OVERRIDES = {"exp.sft.init_from": SFT, "rl.sampler.compute_dtype": "bfloat16", "seed": 0,
                  "exp.ledger": "docs/results/router_replay.jsonl"}     # each arm's episodes (horizon.studies.arms)
PLOT = ("step", "reward_mean")
NOISE = (0.0, 0.3, 1.0)           # std of the engine's router-logit noise (0: bf16 alone)
FILTER_RATIO = 0.5                # a replayed expert whose gate score is < half the router's k-th best is replaced
ARMS = {"no_replay": {"rl.router_replay": False},
        "replay": {"rl.router_replay": True},
        "replay_filter": {"rl.router_replay": True, "model.replay_plausibility_ratio": FILTER_RATIO}}


def get_sweep() -> list[dict]:
    return [{"rl.sampler.router_noise": n, **arm, "exp.arm": f"bf16 engine, noise {n}: {name}"}
            for n in NOISE for name, arm in ARMS.items()]
