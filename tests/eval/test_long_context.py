"""Long-context eval (docs/SPEC.md §1.4): loss per target-position bucket, and passkey exact match that an
oracle passes and a model that cannot know the key fails."""

import jax
import numpy as np
import pytest

from horizon.data import passkey
from horizon.data.tokenizer import ByteTokenizer
from horizon.eval import long_context
from horizon.model import transformer
from horizon.utils.config import load_config_file

TOK = ByteTokenizer(320)


def oracle(tokens):
    """Knows every next token: loss 0, argmax = the next token."""
    return np.zeros((tokens.shape[0], tokens.shape[1] - 1)), np.roll(tokens, -1, axis=1)


def test_bucket_edges_and_per_bucket_means():
    assert long_context.bucket_edges(128, (1, 4, 16)) == [(0, 128), (128, 512), (512, 2048)]

    def by_position(tokens):                      # loss of target t is t: bucket means are known exactly
        b, s = tokens.shape
        return np.broadcast_to(np.arange(1, s, dtype=np.float64), (b, s - 1)), tokens

    docs = np.zeros((5, 64), np.int32)
    out = long_context.bucket_losses(by_position, docs, long_context.bucket_edges(4, (1, 4, 16)), batch_size=2)
    assert out == {"loss_0_4": 2.0, "tokens_0_4": 15, "loss_4_16": 9.5, "tokens_4_16": 60,
                   "loss_16_64": 39.5, "tokens_16_64": 240}
    assert long_context.bucket_losses(oracle, docs, [(0, 64)], batch_size=3)["loss_0_64"] == 0.0


@pytest.mark.parametrize("length", [96, 384])
def test_passkey_accuracy_oracle_scores_one_and_one_wrong_digit_zero(length):
    docs = passkey.passkey_documents(TOK, length, 12, seed=0, stream=passkey.EVAL_STREAM)
    assert long_context.passkey_accuracy(oracle, docs, batch_size=5) == {"acc": 1.0, "digit_acc": 1.0}
    last = {d.tokens.tobytes(): d.answer_start + d.answer_len - 2 for d in docs}   # predicts the last digit

    def off_by_one_digit(tokens):                 # right except the key's last token: no exact match
        nll, pred = oracle(tokens)
        pred = pred.copy()
        for i, t in enumerate(tokens):
            pred[i, last[t.tobytes()]] += 1
        return nll, pred

    acc = long_context.passkey_accuracy(off_by_one_digit, docs, batch_size=5)
    assert acc == {"acc": 0.0, "digit_acc": pytest.approx(0.8)}


def test_a_model_that_cannot_know_the_key_scores_zero():
    docs = passkey.passkey_documents(TOK, 96, 12, seed=0, stream=passkey.EVAL_STREAM)
    c = load_config_file("configs/tiny.py")                # untrained
    c.model.d_model, c.model.num_layers = 32, 2
    params = transformer.init(jax.random.key(0), c.model)
    acc = long_context.passkey_accuracy(long_context.model_scorer(params, c.model), docs, batch_size=4)
    assert acc["acc"] == 0.0 and acc["digit_acc"] < 0.3


def test_evaluate_gives_one_flat_record(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "code").mkdir()
    for i in range(30):
        (tmp_path / "code" / f"f{i}.py").write_text(" ".join(rng.choice(["def", "x", "=", "\n"], size=300)))
    c = load_config_file("configs/pretrain_long.py")
    c.data.root, c.data.sources, c.data.extensions, c.data.heldout_fraction = str(tmp_path), ("code",), (".py",), 0.3
    c.data.seq_len, c.stages.long.seq_len = 80, 320
    c.long_eval.multiples, c.long_eval.passkey_docs, c.long_eval.heldout_docs = (1, 4), 6, 3
    long_context.validate_long_eval(c)
    rec = long_context.evaluate(c, oracle)
    assert rec == {"loss_0_80": 0.0, "tokens_0_80": 3 * 79, "loss_80_320": 0.0, "tokens_80_320": 3 * 240,
                   "passkey_acc_80": 1.0, "passkey_digit_acc_80": 1.0, "passkey_acc_320": 1.0,
                   "passkey_digit_acc_320": 1.0}
    assert long_context.heldout_long_docs(c, 320, 3).shape == (3, 320)
    with pytest.raises(ValueError, match="no held-out document has 100000 tokens"):
        long_context.heldout_long_docs(c, 100_000, 3)
    assert "| oracle | 0.000 | 0.000 | 1.000 | 1.000 |" in long_context.table({"oracle": rec})
