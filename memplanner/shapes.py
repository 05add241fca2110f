"""Model shapes: the handful of numbers every memory term depends on, read from a GGUF
header or a Hugging Face config.json. No tensor data is ever read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memplanner.constants import REPACKED_TYPES

DTYPE_BYTES = {"f32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "f16": 2, "float16": 2, "int8": 1}
_BIASED_QKV_ARCHS = {"qwen2"}  # qwen2 keeps biases on q, k and v projections


@dataclass(frozen=True)
class ModelShape:
    name: str
    arch: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    weight_bytes: int  # exact sum of tensor sizes by their stored type
    file_bytes: int  # what an mmapped GGUF keeps resident; == weight_bytes for HF configs
    context_length_trained: int
    intermediate_size: int = 0  # feed-forward width; 0 when unknown
    repacked_bytes: int = 0  # weights llama.cpp's CPU backend copies into a repack buffer
    embedding_bytes: int = 0  # token embeddings (input); the output head too when tied
    output_bytes: int = 0  # final norm + untied output head
    block_bytes: tuple[int, ...] = ()  # weights of each transformer block, when known (GGUF mixes types)
    tied_output: bool = False  # the output head is token_embd (no output.weight)

    def layer_weight_bytes(self, first: int, count: int) -> int:
        """Weights of blocks first .. first + count - 1 (an even share when sizes are unknown)."""
        if self.block_bytes:
            return sum(self.block_bytes[first:first + count])
        return (self.weight_bytes - self.embedding_bytes - self.output_bytes) * count // max(1, self.num_layers)

    @property
    def kv_elements_per_token(self) -> int:
        """K (or V) elements one token adds to one layer's cache."""
        return self.num_kv_heads * self.head_dim


def shape_from_gguf(path: str | Path) -> ModelShape:
    """Shape of a GGUF model from its header (~0.05 s even for a 1 GB file)."""
    # here: the GPU suite builds ModelShapes on machines without the gguf package
    from memplanner.gguf_header import read_gguf_header
    from memplanner.gguf_sanity import header_problem

    header = read_gguf_header(path)
    problem = header_problem(header)
    if problem is not None:
        raise ValueError(f"{path} cannot be planned for: {problem}")
    meta = header.metadata
    arch = str(meta["general.architecture"])

    def key(name: str, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"{path}: GGUF metadata lacks {arch}.{name}")
        return int(value)

    hidden_size = key("embedding_length")
    num_heads = key("attention.head_count")
    num_kv_heads = key("attention.head_count_kv", num_heads)
    vocab_size = header.array_lengths.get("tokenizer.ggml.tokens") or key("vocab_size")
    return ModelShape(
        name=Path(path).stem,
        arch=arch,
        num_layers=key("block_count"),
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=key("attention.key_length", hidden_size // num_heads),
        vocab_size=vocab_size,
        weight_bytes=sum(tensor.num_bytes for tensor in header.tensors),
        file_bytes=header.file_bytes,
        context_length_trained=key("context_length", 0),
        intermediate_size=key("feed_forward_length", 0),
        repacked_bytes=sum(t.num_bytes for t in header.tensors
                           if t.type_name in REPACKED_TYPES and t.name != "token_embd.weight"),
        embedding_bytes=sum(t.num_bytes for t in header.tensors if t.name == "token_embd.weight"),
        output_bytes=sum(t.num_bytes for t in header.tensors if t.name in ("output.weight", "output_norm.weight")),
        block_bytes=tuple(sum(t.num_bytes for t in header.tensors if t.name.startswith(f"blk.{index}."))
                          for index in range(key("block_count"))),
        tied_output=not any(t.name == "output.weight" for t in header.tensors),
    )


def hf_parameter_count(config: dict) -> int:
    """Parameters of a standard llama / qwen2 decoder (embeddings, attention, SwiGLU MLP, RMSNorms)."""
    hidden = config["hidden_size"]
    num_heads = config["num_attention_heads"]
    num_kv_heads = config.get("num_key_value_heads", num_heads)
    head_dim = config.get("head_dim") or hidden // num_heads
    intermediate = config["intermediate_size"]
    vocab = config["vocab_size"]
    has_qkv_bias = config.get("attention_bias", config.get("model_type") in _BIASED_QKV_ARCHS)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    attention = hidden * (q_size + 2 * kv_size) + q_size * hidden
    if has_qkv_bias:
        attention += q_size + 2 * kv_size
    mlp = 3 * hidden * intermediate + (2 * intermediate + hidden if config.get("mlp_bias") else 0)
    per_layer = attention + mlp + 2 * hidden  # two RMSNorm weights
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return config["num_hidden_layers"] * per_layer + embeddings + hidden  # + final norm


def shape_from_hf_config(config: dict | str | Path, dtype: str = "bf16") -> ModelShape:
    """Shape of a Hugging Face llama/qwen2 model from its config.json (dict or path)."""
    if not isinstance(config, dict):
        path = Path(config)
        config = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    num_heads = config["num_attention_heads"]
    weight_bytes = hf_parameter_count(config) * DTYPE_BYTES[dtype]
    embedding_elements = config["vocab_size"] * config["hidden_size"]
    is_tied = config.get("tie_word_embeddings", False)
    return ModelShape(
        name=config.get("_name_or_path") or config.get("model_type", "hf-model"),
        arch=config.get("model_type", "llama"),
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads", num_heads),
        head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
        vocab_size=config["vocab_size"],
        weight_bytes=weight_bytes,
        file_bytes=weight_bytes,
        context_length_trained=config.get("max_position_embeddings", 0),
        intermediate_size=config["intermediate_size"],
        embedding_bytes=embedding_elements * DTYPE_BYTES[dtype],
        output_bytes=(config["hidden_size"] + (0 if is_tied else embedding_elements)) * DTYPE_BYTES[dtype],
        tied_output=is_tied,
    )
