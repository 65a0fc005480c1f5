"""Synthetic passkey documents (docs/SPEC.md §8): deterministic from the seed, exactly the asked length,
parseable, the answer span where it says, and mixed into the training split at the configured fraction."""

import numpy as np
import pytest

from horizon.data import passkey, pipeline
from horizon.data.tokenizer import ByteTokenizer
from horizon.utils.config import ConfigError, load_config_file

TOK = ByteTokenizer(320)


def test_documents_are_deterministic_exact_length_and_parseable():
    a = passkey.passkey_documents(TOK, 128, 20, seed=3)
    b = passkey.passkey_documents(TOK, 128, 20, seed=3)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        assert (x.key, x.key_start, x.answer_start) == (y.key, y.key_start, y.answer_start)
    assert len({d.key for d in a}) > 15                                    # keys vary with the index
    other = passkey.passkey_documents(TOK, 128, 20, seed=4)
    assert [d.key for d in other] != [d.key for d in a]                   # and with the seed
    evals = passkey.passkey_documents(TOK, 128, 20, seed=3, stream=passkey.EVAL_STREAM)
    assert [d.key for d in evals] != [d.key for d in a]                   # streams differ
    for n, d in [(128, d) for d in a] + [(2048, d) for d in passkey.passkey_documents(TOK, 2048, 5, seed=0)]:
        assert len(d.tokens) == n
        assert d.tokens[0] == TOK.bos_id and d.tokens[-1] == TOK.eos_id
        text = TOK.decode(d.tokens)
        assert passkey.parse(text) == (d.key, d.key), text
        assert text.count(d.key) == 2 and len(d.key) == 5                 # stated once, asked once
        assert TOK.decode(d.tokens[d.answer]) == d.key
        assert TOK.decode(d.tokens[d.key_start:]).startswith("The pass key is " + d.key)
        assert text.endswith("What is the pass key? The pass key is " + d.key + ".")
    depths = [d.depth for d in passkey.passkey_documents(TOK, 2048, 40, seed=1)]
    assert min(depths) < 0.25 and max(depths) > 0.75                      # the key at a random depth


def test_too_short_a_document_is_refused():
    n = passkey.min_length(TOK, 5)
    assert len(passkey.passkey_document(TOK, n, seed=0, index=0).tokens) == n   # no filler at all
    with pytest.raises(ValueError, match="passkey document needs"):
        passkey.passkey_document(TOK, n - 1, seed=0, index=0)


def test_mix_count_makes_the_fraction():
    assert passkey.mix_count(950, 0.05) == 50 and passkey.mix_count(10, 0.0) == 0
    with pytest.raises(ValueError):
        passkey.mix_count(10, 1.0)


@pytest.fixture()
def cfg(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "code").mkdir()
    for i in range(40):
        words = rng.choice(["def", "return", "x", "=", "+", "import", "jax", "\n"], size=int(rng.integers(20, 120)))
        (tmp_path / "code" / f"f{i}.py").write_text(" ".join(words))
    c = load_config_file("configs/tiny.py")
    c.data.root, c.data.sources, c.data.extensions = str(tmp_path), ("code",), (".py",)
    c.data.heldout_fraction, c.data.seq_len, c.data.batch_size = 0.25, 96, 4
    return c


def _passkey_segments(rows):
    found = 0
    for r in range(rows["tokens"].shape[0]):
        seg = rows["segment_ids"][r]
        for s in range(1, seg.max() + 1):
            found += passkey.parse(TOK.decode(rows["tokens"][r][seg == s])) is not None
    return found


def test_pipeline_mixes_the_configured_fraction_into_train_only(cfg):
    plain = pipeline.packed_rows(cfg, "train")
    cfg.data.passkey_fraction = 0.2
    mixed = pipeline.packed_rows(cfg, "train")
    pieces = int(plain["segment_ids"].max(axis=1).sum())                # corpus pieces: unchanged by the mix
    n = _passkey_segments(mixed)
    assert n == passkey.mix_count(pieces, 0.2) and n > 0 and _passkey_segments(plain) == 0
    assert abs(n / (n + pieces) - 0.2) < 0.02
    assert int(mixed["segment_ids"].max(axis=1).sum()) == pieces + n
    assert _passkey_segments(pipeline.packed_rows(cfg, "heldout")) == 0   # held-out loss stays code only
    again = pipeline.packed_rows(cfg.copy_and_resolve_references(), "train")
    np.testing.assert_array_equal(again["tokens"], mixed["tokens"])     # deterministic


def test_answer_loss_trains_only_the_key_read_back(cfg):
    cfg.data.passkey_fraction, cfg.data.passkey_loss = 0.2, "answer"
    rows = pipeline.packed_rows(cfg, "train")
    cfg.data.passkey_loss = "all"
    np.testing.assert_array_equal(pipeline.packed_rows(cfg, "train")["mask"], rows["segment_ids"] > 0)
    seen = 0
    for r in range(rows["tokens"].shape[0]):
        seg = rows["segment_ids"][r]
        for s in range(1, seg.max() + 1):
            toks, mask = rows["tokens"][r][seg == s], rows["mask"][r][seg == s]
            keys = passkey.parse(TOK.decode(toks))
            if keys is None:
                assert mask.all()                                     # code: every token a target
            else:
                seen += 1
                assert TOK.decode(toks[mask > 0]) == keys[1]          # only the answer's digits
    assert seen > 0 and rows["mask"][rows["segment_ids"] == 0].sum() == 0
    cfg.data.passkey_loss, cfg.data.passkey_answer_weight = "answer", 4.0
    heavy = pipeline.packed_rows(cfg, "train")["mask"]
    np.testing.assert_array_equal(heavy, rows["mask"] * np.where(_answer_positions(rows), 4.0, 1.0))


def _answer_positions(rows):
    """Where the answer tokens of passkey segments lie."""
    out = np.zeros(rows["tokens"].shape, bool)
    for r in range(rows["tokens"].shape[0]):
        seg = rows["segment_ids"][r]
        for s in range(1, seg.max() + 1):
            if passkey.parse(TOK.decode(rows["tokens"][r][seg == s])) is not None:
                out[r] |= (seg == s) & (rows["mask"][r] > 0)
    return out


def test_passkey_fields_are_checked(cfg):
    cfg.data.passkey_fraction = 0.05
    passkey.validate_passkey_config(cfg.data, TOK)
    cfg.data.passkey_len = 40
    with pytest.raises(ConfigError, match=r"data\.passkey_len=40: a passkey document of 5 digits needs"):
        passkey.validate_passkey_config(cfg.data, TOK)
    cfg.data.passkey_len, cfg.data.passkey_fraction = 0, 1.0
    with pytest.raises(ConfigError, match=r"data\.passkey_fraction=1\.0"):
        passkey.validate_passkey_config(cfg.data, TOK)
    cfg.data.passkey_fraction, cfg.data.passkey_loss = 0.05, "key"
    with pytest.raises(ConfigError, match=r"data\.passkey_loss='key': must be one of \('all', 'answer'\)"):
        passkey.validate_passkey_config(cfg.data, TOK)
