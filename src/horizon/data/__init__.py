"""horizon.data: tokenizers (the one `Tokenizer` interface), grain pipeline, sequence packing (docs/SPEC.md §8)."""

from horizon.data.packing import PackedRows, chunk, pack_sequences, target_mask, unpack
from horizon.data.pipeline import dataset, eval_batches, make_batches, make_tokenizer
from horizon.data.tokenizer import BPETokenizer, ByteTokenizer, Tokenizer, load_tokenizer, tokenizer_from_config

__all__ = ["BPETokenizer", "ByteTokenizer", "Tokenizer", "load_tokenizer", "tokenizer_from_config", "PackedRows",
           "chunk", "dataset", "eval_batches", "make_batches", "make_tokenizer", "pack_sequences", "target_mask",
           "unpack"]
