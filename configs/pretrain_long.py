"""Two-stage pretraining, short context then long (docs/SPEC.md §1.4, §8), on the tiny model.

    .venv/bin/python experiments/pretrain.py --config=configs/pretrain_long.py

The short stage trains at 128 tokens with synthetic passkey documents mixed in; the long stage at
2048 tokens (16x) with YaRN (factor 16 from 128), the short stage's params and a fresh optimizer
(`horizon.train.stages`). The long-context eval (`horizon.eval.long_context`) runs before the long
stage (short model, its own RoPE and the long stage's YaRN) and after it. Sized for under half an
hour on a 2-core CPU.

The passkey mix is easier and louder than the defaults (5-digit keys, loss on every token, a few
percent of the documents): from those this tiny model stays at chance within the budget, and even
with the answer-only loss the moment retrieval appears varies from run to run. Two digits, 20% of
the documents, the loss on the answer only (the filler is trivial, the stated key is noise) and the
answer's targets weighted 10x make the short stage read the key back well above chance (1/90).
"""

import ml_collections

from horizon.utils.config import sibling_config


def get_config() -> ml_collections.ConfigDict:
    c = sibling_config(__file__, "tiny.py")
    c.model.max_seq_len = 128         # the short stage's length (the long stage sets its own)
    c.model.rope_scaling.original_max_position_embeddings = 128
    c.data.seq_len = 128              # L: the short stage
    c.data.batch_size = 32
    c.data.passkey_fraction = 0.2     # of the training documents (horizon.data.passkey); see the docstring
    c.data.passkey_len = 0            # 0 = data.seq_len
    c.data.passkey_digits = 2
    c.data.passkey_loss = "answer"    # loss on the key read back only ...
    c.data.passkey_answer_weight = 10.0   # ... weighted 10x against the code tokens
    c.train.steps = 3000
    c.train.warmup_steps = 100
    c.train.eval_every = 500
    c.train.checkpoint_every = 500
    c.train.output_dir = "runs/pretrain_long"

    c.stages = ml_collections.ConfigDict()
    c.stages.long = ml_collections.ConfigDict()
    c.stages.long.seq_len = 2048      # 16 L
    c.stages.long.batch_size = 2
    c.stages.long.steps = 400
    c.stages.long.lr = 1e-3
    c.stages.long.warmup_steps = 20
    c.stages.long.eval_every = 100
    c.stages.long.checkpoint_every = 100
    c.stages.long.rope = "yarn"       # "yarn" | "none" (plain RoPE past the trained length: the ablation)
    c.stages.long.passkey_len = 0     # passkey documents in the long stage: 0 = the short stage's length

    c.long_eval = ml_collections.ConfigDict()
    c.long_eval.multiples = (1, 4, 16)  # passkey lengths m * L; loss buckets [0, L), [L, 4L), [4L, 16L)
    c.long_eval.passkey_docs = 100      # per length
    c.long_eval.heldout_docs = 16       # held-out documents of >= 16 L tokens, cut to 16 L
    c.long_eval.batch_size = 4          # rows of 16 L tokens per forward (shorter lengths: as many tokens)
    c.long_eval.seed = 0                # passkey eval documents (horizon.data.passkey.EVAL_STREAM)
    return c
