"""Grain pipeline (docs/SPEC.md §8): deterministic batches by step index, disjoint held-out split by path
hash, packed-row invariants."""

import numpy as np
import pytest

from horizon.data import pipeline, sources
from horizon.data.tokenizer import ByteTokenizer
from horizon.utils.config import load_config_file


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "code" / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(30):
        words = rng.choice(["def", "return", "x", "=", "+", "import", "jax", "\n"], size=int(rng.integers(5, 80)))
        (root / "code" / ("sub" if i % 3 else "") / f"f{i}.py").write_text(f"# file {i}\n" + " ".join(words))
    (root / "code" / "skip.bin").write_bytes(b"\x00\x01")  # wrong extension: ignored
    return root


@pytest.fixture()
def cfg(corpus):
    c = load_config_file("configs/tiny.py")
    c.data.root = str(corpus)
    c.data.sources = ("code",)
    c.data.extensions = (".py",)
    c.data.heldout_fraction = 0.25
    c.data.seq_len = 32
    c.data.batch_size = 4
    return c


def test_heldout_split_is_disjoint_and_by_path(cfg, corpus):
    files = sources.list_files(corpus, cfg.data.sources, cfg.data.extensions)
    assert len(files) == 30 and all(f.endswith(".py") for f in files)
    train = sources.split_files(files, 0.25, "train")
    held = sources.split_files(files, 0.25, "heldout")
    assert set(train).isdisjoint(held) and set(train) | set(held) == set(files)
    assert 0 < len(held) < len(files)
    # A file's split depends only on its path: a sub-list splits the same way.
    assert sources.split_files(files[::2], 0.25, "heldout") == [f for f in held if f in files[::2]]
    # Held-out rows contain exactly the held-out files' tokens (BOS + bytes + EOS each).
    tok = ByteTokenizer(cfg.model.vocab_size)
    rows = pipeline.packed_rows(cfg, "heldout")
    want = sum(len(tok.encode((corpus / f).read_text(), bos=True, eos=True)) for f in held)
    assert int((rows["segment_ids"] > 0).sum()) == want


def test_batches_are_a_pure_function_of_step(cfg):
    a = pipeline.make_batches(cfg, "train")
    first = [next(a) for _ in range(12)]  # > one epoch of rows: exercises the reshuffle too
    resumed = pipeline.make_batches(cfg, "train", start_step=7)
    for k in range(7, 12):
        b = next(resumed)
        for key in pipeline.BATCH_KEYS:
            np.testing.assert_array_equal(first[k][key], b[key])
    assert not np.array_equal(first[0]["tokens"], first[1]["tokens"])
    # Threaded prefetch (data.worker_count > 0) yields the same batches in the same order.
    cfg.data.worker_count = 2
    threaded = pipeline.make_batches(cfg, "train", start_step=7)
    for k in range(7, 12):
        np.testing.assert_array_equal(first[k]["tokens"], next(threaded)["tokens"])
    cfg.data.worker_count = 0
    # A different shuffle seed gives a different order.
    cfg.data.shuffle_seed = 1
    other = next(pipeline.make_batches(cfg, "train"))
    assert not np.array_equal(other["tokens"], first[0]["tokens"])


def test_batch_layout(cfg):
    tok = ByteTokenizer(cfg.model.vocab_size)
    b = next(pipeline.make_batches(cfg, "train", start_step=3))
    assert {k: (v.shape, v.dtype.name) for k, v in b.items()} == {
        "tokens": ((4, 32), "int32"), "segment_ids": ((4, 32), "int32"),
        "positions": ((4, 32), "int32"), "mask": ((4, 32), "float32")}
    np.testing.assert_array_equal(b["mask"], (b["segment_ids"] > 0).astype(np.float32))
    seg, pos = b["segment_ids"], b["positions"]
    starts = (pos == 0) & (seg > 0)
    # A new segment starts exactly where the segment id changes, and positions count up within it.
    change = np.concatenate([seg[:, :1] > 0, (seg[:, 1:] != seg[:, :-1]) & (seg[:, 1:] > 0)], axis=1)
    np.testing.assert_array_equal(starts, change)
    inner = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
    np.testing.assert_array_equal(pos[:, 1:][inner], pos[:, :-1][inner] + 1)
    assert np.all(b["tokens"][seg == 0] == tok.PAD)
    # Multi-host slicing: process 1 of 2 gets the second half of the same global batch.
    half = next(pipeline.make_batches(cfg, "train", start_step=3, process_index=1, process_count=2))
    np.testing.assert_array_equal(half["tokens"], b["tokens"][2:])


def test_bad_config_errors(cfg):
    cfg.data.sources = ("missing_dir",)
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        next(pipeline.make_batches(cfg, "train"))
    with pytest.raises(ValueError, match="split"):
        sources.split_files(["a.py"], 0.1, "test")
