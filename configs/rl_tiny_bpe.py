"""`make run`'s pipeline (SFT demos, RL in Docker, held-out eval) with a real BPE tokenizer.

configs/rl_tiny.py with `model.tokenizer` = envs/tokenizers/bpe1024.json, the repo's own byte-level
BPE (experiments/train_bpe.py: 1024 ids trained on the pretraining corpus, horizon's chat specials
as ids 0..7). Why 1024, the smallest of the range: the tiny model (d_model 64) pays 2 x vocab x 64
parameters for its embedding and LM head, so 1024 ids keep those near the rest of the model, and
the rarer tokens of a larger vocabulary would each get fewer of the SFT demos' updates; it still
shortens the tool call from 94 byte tokens to 50 (2048 ids: 33) and code to 2.39 bytes per token.

Budgets are re-derived from token counts printed by `.venv/bin/python experiments/train_bpe.py`
(configs/rl_tiny.py's first task: rendered context 59 bytes -> 31 BPE tokens, one-call solution
94 -> 50 tokens): generation 64 (call 50), context limit 120 / trigger 100, model.max_seq_len 128,
SFT rows of 96 tokens, sampler and trainer buckets halved. The length penalty stays off (as in
rl_tiny.py), but its per-token weights are rescaled by the measured bytes per token (2.39 on
held-out code) so that, if enabled, a BPE episode pays what the same text costs at byte level.
"""

import pathlib

from horizon.utils.config import sibling_config

BPE_FILE = pathlib.Path(__file__).resolve().parents[1] / "envs" / "tokenizers" / "bpe1024.json"
BYTES_PER_TOKEN = 2.39      # held-out code, printed by experiments/train_bpe.py (vocab 1024)


def get_config():
    c = sibling_config(__file__, "rl_tiny.py")
    m = c.model
    m.tokenizer = str(BPE_FILE)
    m.vocab_size = 1024
    m.max_seq_len = 128
    c.agent.update(dict(max_new_tokens=64, max_context_tokens=120, trigger_tokens=100))
    r = c.rl
    r.sampler.update(dict(min_prompt_bucket=64, min_new_bucket=64))
    r.batch.update(dict(min_seq=128))
    w = r.length_penalty.weights
    for k in ("thinking", "tool_call", "tool_output", "final"):     # per-token weights; per-call ones unchanged
        w[k] = float(w[k]) * BYTES_PER_TOKEN
    e = c.exp
    e.out_dir = "runs/rl_tiny_bpe"
    e.sft.seq_len = 96
    return c
