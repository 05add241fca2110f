"""Reading a llama / qwen2 GGUF for the torch model: its config and its tensors, one at a time.

Tensors are dequantized to float32 with the gguf package. llama.cpp's converter
permutes the Q and K rows of llama-architecture models for its interleaved RoPE
(convert_hf_to_gguf.py, LlamaModel.permute); this undoes it so every checkpoint uses the
rotate-half layout of model.py. qwen2 is converted unpermuted (llama.cpp runs it with
NEOX RoPE), so its tensors are taken as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import gguf
import numpy as np

from pocketspec.errors import UserError
from pocketspec.torch_model.model import ModelConfig

SUPPORTED_ARCHS = ("llama", "qwen2")
PERMUTED_QK_ARCHS = ("llama",)
_LAYER_NAMES = {
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight", "attn_q.bias": "attention.wq.bias",
    "attn_k.weight": "attention.wk.weight", "attn_k.bias": "attention.wk.bias",
    "attn_v.weight": "attention.wv.weight", "attn_v.bias": "attention.wv.bias",
    "attn_output.weight": "attention.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w_gate.weight",
    "ffn_up.weight": "feed_forward.w_up.weight",
    "ffn_down.weight": "feed_forward.w_down.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight",
                 "output.weight": "output.weight"}


def module_name(gguf_name: str) -> str:
    """'blk.3.attn_q.weight' -> 'layers.3.attention.wq.weight'."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    if rest not in _LAYER_NAMES:
        raise UserError(f"unexpected tensor {gguf_name!r} in the GGUF: the torch backend knows llama and qwen2 only")
    return f"layers.{layer}.{_LAYER_NAMES[rest]}"


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's permute: interleaved RoPE pairs back to rotate-half halves."""
    head_dim = weight.shape[0] // num_heads
    rest = weight.shape[1:]
    return weight.reshape(num_heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


class GGUFWeights:
    """An open GGUF: `config` and `tensors()`, which yields (module name, float32 array)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        try:
            self._reader = gguf.GGUFReader(str(path))
        except (OSError, ValueError) as error:
            raise UserError(f"cannot read {path} as GGUF: {error}") from None
        arch = self._field("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise UserError(f"{path}: architecture {arch!r} is not supported by --backend torch "
                            f"(use one of {', '.join(SUPPORTED_ARCHS)}, or --backend llama.cpp)")
        names = {tensor.name for tensor in self._reader.tensors}
        dim = int(self._field(f"{arch}.embedding_length"))
        num_heads = int(self._field(f"{arch}.attention.head_count"))
        self.config = ModelConfig(
            arch=arch,
            num_layers=int(self._field(f"{arch}.block_count")),
            dim=dim,
            num_heads=num_heads,
            num_kv_heads=int(self._field(f"{arch}.attention.head_count_kv", num_heads)),
            head_dim=int(self._field(f"{arch}.attention.key_length", dim // num_heads)),
            ffn_dim=int(self._field(f"{arch}.feed_forward_length")),
            vocab_size=len(self._reader.fields["tokenizer.ggml.tokens"].data),
            rope_base=float(self._field(f"{arch}.rope.freq_base", 10000.0)),
            norm_eps=float(self._field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            has_qkv_bias="blk.0.attn_q.bias" in names,
            is_tied="output.weight" not in names,
        )

    def _field(self, key: str, default=None):
        field = self._reader.fields.get(key)
        if field is None:
            if default is None:
                raise UserError(f"{self.path}: GGUF metadata lacks {key}")
            return default
        return field.contents()

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        config = self.config
        for tensor in self._reader.tensors:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
            array = array.reshape([int(n) for n in reversed(tensor.shape)])
            if config.arch in PERMUTED_QK_ARCHS and ".attn_q." in tensor.name:
                array = unpermute_qk(array, config.num_heads)
            elif config.arch in PERMUTED_QK_ARCHS and ".attn_k." in tensor.name:
                array = unpermute_qk(array, config.num_kv_heads)
            yield module_name(tensor.name), array

    def close(self) -> None:
        self._reader = None  # drops the memory map
