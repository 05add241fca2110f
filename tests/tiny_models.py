"""Tiny llama-architecture GGUF models with random weights, written with the gguf package.

A target and a draft that shares its vocabulary (the target's weights plus noise), so
the whole speculative path runs in milliseconds on real llama.cpp.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

QUANT = gguf.GGMLQuantizationType.Q4_1
WORDS = tuple(dict.fromkeys(("the a of to and in is it that for on with as was be at by this from or an are not but "
                             "def return if else while import print class self true false none list dict int str").split()))


def tiny_vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + ["▁" + word for word in WORDS]
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(WORDS))
    scores = [0.0] * 259 + [-float(index) for index in range(len(WORDS))]
    return tokens, scores, [int(kind) for kind in types]


def tiny_weights(rng: np.random.Generator, vocab_size: int, dim: int, num_layers: int, num_heads: int,
             num_kv_heads: int, ffn_dim: int, has_qkv_bias: bool = False) -> dict[str, np.ndarray]:
    head_dim = dim // num_heads

    def matrix(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    tensors = {"token_embd.weight": matrix(vocab_size, dim, np.sqrt(dim)),
               "output_norm.weight": np.ones(dim, dtype=np.float32),
               "output.weight": matrix(vocab_size, dim, 4.0)}
    for layer in range(num_layers):
        prefix = f"blk.{layer}."
        tensors.update({
            prefix + "attn_norm.weight": np.ones(dim, dtype=np.float32),
            prefix + "attn_q.weight": matrix(dim, dim),
            prefix + "attn_k.weight": matrix(num_kv_heads * head_dim, dim),
            prefix + "attn_v.weight": matrix(num_kv_heads * head_dim, dim),
            prefix + "attn_output.weight": matrix(dim, dim),
            prefix + "ffn_norm.weight": np.ones(dim, dtype=np.float32),
            prefix + "ffn_gate.weight": matrix(ffn_dim, dim),
            prefix + "ffn_up.weight": matrix(ffn_dim, dim),
            prefix + "ffn_down.weight": matrix(dim, ffn_dim),
        })
        if has_qkv_bias:
            for name, size in (("attn_q", dim), ("attn_k", num_kv_heads * head_dim), ("attn_v", num_kv_heads * head_dim)):
                tensors[prefix + name + ".bias"] = rng.standard_normal(size).astype(np.float32) * 0.5
    return tensors


def write_tiny_model(path: Path, tensors: dict[str, np.ndarray], *, dim: int, num_layers: int, num_heads: int,
                     num_kv_heads: int, ffn_dim: int, context_length: int = 1024, arch: str = "llama",
                     quant: gguf.GGMLQuantizationType | None = QUANT, rope_base: float = 10000.0) -> Path:
    """quant=None writes every tensor as F32 (no quantization noise, for torch-vs-llama.cpp checks)."""
    tokens, scores, types = tiny_vocabulary()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    writer.add_context_length(context_length)
    writer.add_embedding_length(dim)
    writer.add_block_count(num_layers)
    writer.add_feed_forward_length(ffn_dim)
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    writer.add_rope_dimension_count(dim // num_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(rope_base)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    for name, array in tensors.items():
        if array.ndim == 2 and quant is not None:
            # Q4_1 like SmolLM2: llama.cpp's batched and one-token kernels agree on it bit for bit
            writer.add_tensor(name, gguf.quants.quantize(array, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_pair(folder: Path, seed: int = 0, draft_noise: float = 0.3, *, arch: str = "llama",
                    quant: gguf.GGMLQuantizationType | None = QUANT, num_layers: int = 2) -> tuple[Path, Path]:
    """A random target and a draft made of the same weights plus noise (same vocabulary).

    arch="qwen2" adds q/k/v biases; quant=None keeps every tensor in F32.
    """
    shape = dict(dim=64, num_layers=num_layers, num_heads=4, num_kv_heads=2, ffn_dim=128)
    rng = np.random.default_rng(seed)
    vocab_size = len(tiny_vocabulary()[0])
    target_tensors = tiny_weights(rng, vocab_size, shape["dim"], shape["num_layers"], shape["num_heads"],
                              shape["num_kv_heads"], shape["ffn_dim"], has_qkv_bias=arch == "qwen2")
    draft_tensors = {name: (array + draft_noise * array.std() * rng.standard_normal(array.shape)).astype(np.float32)
                     if array.ndim == 2 else array for name, array in target_tensors.items()}
    suffix = "" if (arch, quant) == ("llama", QUANT) else f"-{arch}-{'f32' if quant is None else quant.name.lower()}"
    target = write_tiny_model(folder / f"tiny-target{suffix}.gguf", target_tensors, arch=arch, quant=quant, **shape)
    draft = write_tiny_model(folder / f"tiny-draft{suffix}.gguf", draft_tensors, arch=arch, quant=quant, **shape)
    return target, draft


def write_near_tie_model(path: Path, seed: int = 0, relative_gap: float = 1e-6) -> Path:
    """An F32 target whose output head comes in twin rows 2i, 2i + 1 that differ by `relative_gap`.

    Every greedy choice is then a near-tie with its twin, closer than fp32 matmuls of different
    shapes agree: the model on which decoding that is not batch-invariant visibly diverges.
    Its other weights equal write_tiny_pair's target of the same seed, so that pair's draft suits it.
    """
    shape = dict(dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=128)
    rng = np.random.default_rng(seed)
    tensors = tiny_weights(rng, len(tiny_vocabulary()[0]), **shape)
    head = tensors["output.weight"]
    num_twins = len(head) // 2
    noise = relative_gap * np.random.default_rng(seed + 1).standard_normal(head[1::2][:num_twins].shape)
    head[1::2][:num_twins] = head[0::2][:num_twins] * (1 + noise).astype(np.float32)
    return write_tiny_model(path, tensors, quant=None, **shape)


SHAPE_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
              "attention.head_count_kv", "rope.dimension_count")


def write_header_variant(path: Path, arch: str = "llama", drop: tuple[str, ...] = (), **values) -> Path:
    """A tiny F32 llama model whose header says `values` instead of the truth, for tests of header checks.

    Keys are SHAPE_KEYS with `__` for `.` (attention__head_count=0), or token_bos / token_eos;
    `drop` leaves SHAPE_KEYS out; `arch` renames the architecture. The tensors keep their shape.
    """
    shape = dict(dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=128)
    tokens, scores, types = tiny_vocabulary()
    header = dict(zip(SHAPE_KEYS, (1024, shape["dim"], shape["num_layers"], shape["ffn_dim"], shape["num_heads"],
                                   shape["num_kv_heads"], shape["dim"] // shape["num_heads"])))
    header.update({key.replace("__", "."): value for key, value in values.items() if not key.startswith("token_")})
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    for key, value in header.items():
        if key not in drop:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(values.get("token_bos", 1))
    writer.add_eos_token_id(values.get("token_eos", 2))
    writer.add_unk_token_id(0)
    for name, array in tiny_weights(np.random.default_rng(0), len(tokens), **shape).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
