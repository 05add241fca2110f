"""Reading a llama / qwen2 GGUF for the torch model: its config and its tensors, one at a time.

Tensors are dequantized to float32 with the gguf package. llama.cpp's converter
permutes the Q and K rows of llama-architecture models for its interleaved RoPE
(convert_hf_to_gguf.py, LlamaModel.permute); this undoes it so every checkpoint uses the
rotate-half layout of model.py. qwen2 is converted unpermuted (llama.cpp runs it with
NEOX RoPE), so its tensors are taken as they are.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator

import gguf
import numpy as np

from memplanner.gguf_header import TensorInfo, read_gguf_header
from memplanner.torch_peak import DEQUANTIZE_CHUNK_BYTES  # float32 bytes dequantized at once
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


def _dequantize(data: np.ndarray, tensor_type, shape) -> np.ndarray:
    return gguf.quants.dequantize(data, tensor_type).astype(np.float32, copy=False).reshape(shape)


class GGUFWeights:
    """An open GGUF: `config` and `tensors()`, which yields each tensor as chunks of float32 rows.

    The header comes from memplanner.gguf_header: gguf.GGUFReader builds a numpy object per
    vocabulary entry, 159 MiB of RSS for SmolLM2's 49152 tokens (measured 2026-11-23) and
    seconds for Qwen's 151936. The tensor data is one read-only memory map.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        try:
            header = read_gguf_header(path)
        except (OSError, ValueError, KeyError, struct.error) as error:
            raise UserError(f"cannot read {path} as GGUF: {error}") from None
        if header.data_end > header.file_bytes:
            raise UserError(f"{path} is truncated: its tensors need {header.data_end} bytes, the file has "
                            f"{header.file_bytes}")
        self._metadata = header.metadata
        self._tensors = header.tensors
        arch = self._field("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise UserError(f"{path}: architecture {arch!r} is not supported by --backend torch or onnx "
                            f"(use one of {', '.join(SUPPORTED_ARCHS)}, or --backend llama.cpp)")
        if "tokenizer.ggml.tokens" not in header.array_lengths:
            raise UserError(f"{path}: GGUF metadata lacks tokenizer.ggml.tokens")
        names = {tensor.name for tensor in header.tensors}
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
            vocab_size=header.array_lengths["tokenizer.ggml.tokens"],
            rope_base=float(self._field(f"{arch}.rope.freq_base", 10000.0)),
            norm_eps=float(self._field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            has_qkv_bias="blk.0.attn_q.bias" in names,
            is_tied="output.weight" not in names,
        )
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")

    def _field(self, key: str, default=None):
        value = self._metadata.get(key)
        if value is None:
            if default is None:
                raise UserError(f"{self.path}: GGUF metadata lacks {key}")
            return default
        return value

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...], Iterator[tuple[int, np.ndarray]]]]:
        """(module name, shape, row chunks): each chunk is (first row, float32 rows), dequantized
        only when asked for, so a large embedding never exists whole in float32 beside its copy."""
        for tensor in self._tensors:
            yield module_name(tensor.name), tuple(reversed(tensor.dims)), self._row_chunks(tensor)

    def _row_chunks(self, tensor: TensorInfo) -> Iterator[tuple[int, np.ndarray]]:
        shape = tuple(reversed(tensor.dims))
        tensor_type = gguf.GGMLQuantizationType[tensor.type_name]
        raw = self._data[tensor.data_offset:tensor.data_offset + tensor.num_bytes]
        rows = raw.reshape(int(np.prod(shape[:-1])), -1)  # [rows, bytes of one row of blocks]
        permuted_heads = None
        if self.config.arch in PERMUTED_QK_ARCHS and ".attn_q." in tensor.name:
            permuted_heads = self.config.num_heads
        elif self.config.arch in PERMUTED_QK_ARCHS and ".attn_k." in tensor.name:
            permuted_heads = self.config.num_kv_heads
        if len(shape) == 1 or permuted_heads is not None:
            array = _dequantize(rows, tensor_type, shape)
            yield 0, array if permuted_heads is None else unpermute_qk(array, permuted_heads)
            return
        rows_per_chunk = max(1, DEQUANTIZE_CHUNK_BYTES // (4 * shape[-1]))
        for start in range(0, shape[0], rows_per_chunk):
            yield start, _dequantize(rows[start:start + rows_per_chunk], tensor_type, (-1, shape[-1]))

    def close(self) -> None:
        self._data = None  # drops the memory map
