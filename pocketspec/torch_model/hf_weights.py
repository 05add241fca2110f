"""Reading a Hugging Face llama / qwen2 directory (config.json + *.safetensors) for the torch model.

Hugging Face checkpoints already use the rotate-half RoPE layout of model.py, so no
tensor is permuted. Tensors are read one at a time from the safetensors files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import torch

from pocketspec.errors import UserError
from pocketspec.torch_model.model import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
_LAYER_NAMES = {
    "input_layernorm.weight": "attention_norm.weight",
    "self_attn.q_proj.weight": "attention.wq.weight", "self_attn.q_proj.bias": "attention.wq.bias",
    "self_attn.k_proj.weight": "attention.wk.weight", "self_attn.k_proj.bias": "attention.wk.bias",
    "self_attn.v_proj.weight": "attention.wv.weight", "self_attn.v_proj.bias": "attention.wv.bias",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "feed_forward.w_gate.weight",
    "mlp.up_proj.weight": "feed_forward.w_up.weight",
    "mlp.down_proj.weight": "feed_forward.w_down.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
                 "lm_head.weight": "output.weight"}
_LAYER_PATTERN = re.compile(r"model\.layers\.(\d+)\.(.+)")


def module_name(hf_name: str) -> str | None:
    """'model.layers.3.self_attn.q_proj.weight' -> 'layers.3.attention.wq.weight'; None for unused tensors."""
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    match = _LAYER_PATTERN.fullmatch(hf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        return None
    return f"layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"


class HFWeights:
    """An HF model directory: `config` and `tensors()`, which yields each tensor as one chunk."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        try:
            config = json.loads((self.path / "config.json").read_text())
        except (OSError, ValueError) as error:
            raise UserError(f"{path}: cannot read config.json ({error}); give a GGUF file or an HF model folder") from None
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(f"{path}: model_type {model_type!r} is not supported by --backend torch "
                            f"(use one of {', '.join(SUPPORTED_MODEL_TYPES)})")
        self.files = sorted(self.path.glob("*.safetensors"))
        if not self.files:
            raise UserError(f"{path} holds no *.safetensors files")
        num_heads = config["num_attention_heads"]
        # transformers 5 moved rope_theta into rope_parameters; older config.json files keep it at the top
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise UserError(f"{path}: RoPE scaling {rope.get('rope_type', rope.get('type'))!r} is not supported "
                            "by --backend torch")
        self.config = ModelConfig(
            arch=model_type,
            num_layers=config["num_hidden_layers"],
            dim=config["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads", num_heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
            ffn_dim=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            rope_base=float(config.get("rope_theta") or rope.get("rope_theta", 10000.0)),
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            has_qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            is_tied=bool(config.get("tie_word_embeddings", False)),
        )

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...], Iterator[tuple[int, torch.Tensor]]]]:
        """(module name, shape, row chunks) as GGUFWeights gives them; a safetensors tensor is one
        chunk, kept in its stored dtype."""
        from safetensors import safe_open

        for file in self.files:
            with safe_open(str(file), framework="pt") as reader:
                for hf_name in reader.keys():
                    name = module_name(hf_name)
                    if name is None or (name == "output.weight" and self.config.is_tied):
                        continue
                    tensor = reader.get_tensor(hf_name)
                    yield name, tuple(tensor.shape), iter([(0, tensor)])

    def close(self) -> None:
        pass
