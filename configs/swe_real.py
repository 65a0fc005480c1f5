"""The report's setting on real repositories (docs/REAL_REPOS.md): SFT on gold-patch demonstrations,
then RL on the train repositories' instances, then held-out evaluation on unseen instances of the
train repositories and on held-out repositories. One config for every phase; each phase is one
command of at most 90 minutes on 2 cores, and they share checkpoints through `exp.out_dir`.

    python envs/build_repo_images.py --config.repos='("parse","cachetools","semver","inflection")' \
        --config.heldout='("inflection",)' --config.gen.n_candidates=40 --config.gen.n_features=4 \
        --config.gen.n_combined=8 --config.unseen_fraction=0.2 --config.out_dir=runs/swe_real/tasks
    python experiments/rl.py --config=configs/swe_real.py --config.exp.stop_after_sft=True   # demos + SFT (out_dir/sft)
    python experiments/rl.py --config=configs/swe_real.py                         # RL from that SFT

configs/rl_swegen.py's loop and sandboxes with the repo's BPE tokenizer (envs/tokenizers/bpe1024.json:
a generated instance's prompt is ~1.5k tokens instead of ~3.7k bytes) and an agent that can take the
demonstrator's path: up to 12 turns, a call of up to 512 tokens (an edit of a 7-line hunk with its
context is ~150), and self-summary at 3000 of the 4000-token context (a demonstration of a two-hunk
patch crosses it once: `horizon.env.swe_demos`).
"""

from horizon.utils.config import sibling_config


def get_config():
    c = sibling_config(__file__, "rl_swegen.py")
    bpe = sibling_config(__file__, "rl_tiny_bpe.py")      # the tokenizer and its per-token penalty weights
    m = c.model
    m.tokenizer, m.vocab_size = bpe.model.tokenizer, bpe.model.vocab_size
    m.max_seq_len = 4096
    # 16 rotary dims (8 frequencies) instead of tiny's 8: the 4-frequency model did not learn the
    # call format at these 1.5k-4k-token contexts (docs/REAL_REPOS.md "What the warm start needed")
    m.qk_rope_head_dim = 16
    c.agent.update(dict(max_turns=12, max_new_tokens=512, max_context_tokens=4000, trigger_tokens=3000,
                        context_strategy="self_summary", summary_max_tokens=256, max_malformed_calls=2))
    c.rl.length_penalty.weights = bpe.rl.length_penalty.weights
    c.rl.batch.micro_rows = 12        # a chain can have agent.max_turns segments (self-summary) and must fit one
    e = c.exp
    e.task.train_path = "runs/swe_real/tasks/train.jsonl"
    e.task.heldout_path = "runs/swe_real/tasks/heldout.jsonl"      # the held-out repositories
    e.out_dir = "runs/swe_real"
    e.n_sft_tasks = 4096              # demonstrations of every distinct train instance (warmstart.swebench_warm_start)
    e.pool_size = 8
    # one stage of 600 steps (~9 epochs of the demonstrations) without recompute (a 4 x 4096-token step
    # fits without it); the probe decodes the unseen instances' demonstration turns every 200 steps
    e.sft.update(dict(clean_steps=0, steps=600, batch_size=4, seq_len=4096, log_every=25, remat=False,
                      probe_every=200, probe_turns=64,
                      probe_path="runs/swe_real/tasks/unseen.jsonl"))   # the probe's contexts (never trained on)
    e.sft.optim.update(dict(lr=3e-3, warmup_steps=20))
    e.eval.update(dict(n_tasks=16, passes=1))
    return c
