"""DeepSeek-V3 / Kimi-K2 Hugging Face checkpoints <-> horizon params (`docs/SPEC.md §1.5`).

Torch-free: safetensors files are read and written tensor by tensor (`safetensors`), so a checkpoint
streams through host memory. Entry point for drivers: `load_pretrained(dir)` -> (model config,
params) from a directory as transformers' ``save_pretrained`` writes it (config.json +
``*.safetensors``, sharded with a ``model.safetensors.index.json`` or not) or as
`export_hf_checkpoint` writes it; `apply_init_from` / `pretrained_params` start a run from one.

Modules: `config` (config.json <-> model config, with the field table), `names` (tensor names <->
param slots, with the tensor table), `safetensors` (reader / writer, FP8 dequantization), `load`,
`export`, `init_from`.
"""

from horizon.model.hf.config import (
    default_base,
    hf_config_from_model_config,
    model_config_from_hf,
    model_section,
    read_hf_config,
)
from horizon.model.hf.export import export_hf_checkpoint
from horizon.model.hf.init_from import CHAT_TOKENIZER_FILE, apply_init_from
from horizon.model.hf.load import fresh_mtp_params, load_hf_checkpoint, load_pretrained, pretrained_params
from horizon.model.hf.names import Entry, hf_entries, iter_hf_names, mtp_layer_of, param_spec
from horizon.model.hf.safetensors import CheckpointReader, TensorSource, read_header, write_safetensors

__all__ = [
    "CHAT_TOKENIZER_FILE", "CheckpointReader", "Entry", "TensorSource", "apply_init_from", "default_base",
    "export_hf_checkpoint", "fresh_mtp_params", "hf_config_from_model_config", "hf_entries", "iter_hf_names",
    "load_hf_checkpoint", "load_pretrained", "model_config_from_hf", "model_section", "mtp_layer_of",
    "param_spec", "pretrained_params", "read_hf_config", "read_header", "write_safetensors",
]
