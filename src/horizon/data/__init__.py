"""horizon.data: byte tokenizer, grain pipeline, sequence packing (SPEC §8)."""

from horizon.data.packing import PackedRows, chunk, pack_sequences, target_mask, unpack
from horizon.data.pipeline import dataset, eval_batches, make_batches, make_tokenizer
from horizon.data.tokenizer import ByteTokenizer, HFTokenizer

__all__ = ["ByteTokenizer", "HFTokenizer", "PackedRows", "chunk", "dataset", "eval_batches",
           "make_batches", "make_tokenizer", "pack_sequences", "target_mask", "unpack"]
