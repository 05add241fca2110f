"""Whether a GGUF header's shape values can be trusted, before the planner divides by them or llama.cpp loads them.

The planner divides by head counts and multiplies by layer counts; llama.cpp aborts the
process (GGML_ASSERT, exit 134) on some values it does not check itself. So every value
either relies on is checked here: the architecture is one llama.cpp knows, each count is
positive and plausible, and the dimensions agree with the tensors the file holds.
`header_problem` returns the first problem as one sentence, or None.
"""

from __future__ import annotations

import re

from gguf import MODEL_ARCH_NAMES

from memplanner.gguf_header import GGUFHeader

KNOWN_ARCHS = frozenset(MODEL_ARCH_NAMES.values())
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # hidden size, feed-forward width, heads: far above any released model
MAX_CONTEXT = 1 << 24
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.")


def _count(metadata: dict, key: str, low: int, high: int, required: bool = True) -> tuple[int | None, str | None]:
    """(value, problem): a whole number in [low, high], or per-layer list of them (first one returned)."""
    value = metadata.get(key)
    if value is None:
        return None, (f"its metadata lacks {key}" if required else None)
    values = value if isinstance(value, list) else [value]
    for item in values:
        if isinstance(item, bool) or not isinstance(item, int):
            return None, f"{key} is {item!r}, not a whole number"
        if not low <= item <= high:
            return None, f"{key} is {item}, outside {low}..{high}"
    return values[0] if values else None, None


def _check_tensors(header: GGUFHeader, arch: str, num_layers: int, hidden: int, num_heads: int,
                   num_kv_heads: int, head_dim: int, vocab_size: int) -> str | None:
    tensors = {tensor.name: tensor for tensor in header.tensors}
    if any(dim <= 0 for tensor in header.tensors for dim in tensor.dims):
        empty = next(tensor.name for tensor in header.tensors if any(dim <= 0 for dim in tensor.dims))
        return f"tensor {empty} has a zero dimension"
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        return "it holds no token_embd.weight tensor"
    if embedding.dims[:2] != (hidden, vocab_size):
        return (f"token_embd.weight is {list(embedding.dims)} but {arch}.embedding_length is {hidden} and the "
                f"vocabulary has {vocab_size} tokens")
    block_indices = {int(match.group(1)) for name in tensors if (match := _BLOCK_NAME.match(name))}
    if block_indices and (max(block_indices) >= num_layers or len(block_indices) != num_layers):
        return f"{arch}.block_count is {num_layers} but the file holds tensors for {len(block_indices)} blocks"
    for layer in sorted(block_indices):
        for name, width in (("attn_q", num_heads * head_dim), ("attn_k", num_kv_heads * head_dim)):
            tensor = tensors.get(f"blk.{layer}.{name}.weight")
            if tensor is not None and tensor.dims[:2] != (hidden, width):
                return (f"blk.{layer}.{name}.weight is {list(tensor.dims)}, but the heads give "
                        f"[{hidden}, {width}]")
    return None


def header_problem(header: GGUFHeader) -> str | None:
    """The first value of `header` the planner or llama.cpp could not rely on, as a sentence; None if all are sound."""
    metadata = header.metadata
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return "it does not name its architecture (general.architecture)"
    if arch not in KNOWN_ARCHS:
        return f"its architecture {arch!r} is not one llama.cpp knows"
    num_layers, problem = _count(metadata, f"{arch}.block_count", 1, MAX_LAYERS)
    if problem:
        return problem
    hidden, problem = _count(metadata, f"{arch}.embedding_length", 1, MAX_WIDTH)
    if problem:
        return problem
    num_heads, problem = _count(metadata, f"{arch}.attention.head_count", 1, MAX_WIDTH)
    if problem:
        return problem
    num_kv_heads, problem = _count(metadata, f"{arch}.attention.head_count_kv", 1, num_heads, required=False)
    if problem:
        return problem
    num_kv_heads = num_kv_heads or num_heads
    if num_heads % num_kv_heads:
        return f"{arch}.attention.head_count {num_heads} is not a multiple of head_count_kv {num_kv_heads}"
    head_dim, problem = _count(metadata, f"{arch}.attention.key_length", 1, MAX_WIDTH, required=False)
    if problem:
        return problem
    if head_dim is None:
        if hidden % num_heads:
            return f"{arch}.embedding_length {hidden} is not a multiple of attention.head_count {num_heads}"
        head_dim = hidden // num_heads
    for key, low, high in (("context_length", 1, MAX_CONTEXT), ("feed_forward_length", 1, MAX_WIDTH),
                           ("attention.value_length", 1, MAX_WIDTH)):
        _, problem = _count(metadata, f"{arch}.{key}", low, high, required=key == "context_length")
        if problem:
            return problem
    vocab_size = header.array_lengths.get("tokenizer.ggml.tokens", 0)
    if vocab_size <= 0:
        return "its tokenizer vocabulary (tokenizer.ggml.tokens) is empty"
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        _, problem = _count(metadata, key, 0, vocab_size - 1, required=False)
        if problem:
            return f"{problem} (the vocabulary has {vocab_size} tokens)"
    return _check_tensors(header, arch, num_layers, hidden, num_heads, num_kv_heads, head_dim, vocab_size)
