"""Exact bytes the torch backend allocates: weights in each format and KV caches in each dtype.

Pure arithmetic on a ModelShape. Float formats store every tensor in their dtype.
int8 and int4 quantize only the linear layers (the output head too when untied);
embeddings, norms and biases stay in the compute dtype, which is fp32 on a CPU and bf16
on a GPU for the integer formats. int8 keeps one scale per output row; int4 packs two
values a byte and keeps a scale and a zero per group of INT4_GROUP_SIZE inputs. Scales and
zeros are 2-byte floats whatever the compute dtype (bf16 beside fp32: what torch's fused
CPU kernels read, pocketspec/torch_model/quant_kernels.py); packing for a kernel keeps the
weight's bytes.
The rope frequency table (head_dim / 2 float32) is the one buffer beside the weights.
"""

from __future__ import annotations

from memplanner.shapes import ModelShape

FLOAT_FORMAT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
WEIGHT_FORMATS = ("fp32", "bf16", "fp16", "int8", "int4")
KV_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
KV_DTYPES = tuple(KV_DTYPE_BYTES)
AUTO = "auto"  # --weights: from the device; KV dtypes: the weights' compute format
INT8_KV_SCALE_BYTES = 4  # one float32 scale per (head, position), for keys and values each
INT4_GROUP_SIZE = 32
# The float slice of an int8 weight that a GPU verify dequantizes at a time
# (pocketspec/torch_model/quant_kernels.int8_dequantized_mm; an 8B model's untied head would be 1 GiB whole)
INT8_DEQUANTIZE_SLICE_BYTES = 64 * 1024 * 1024
QUANT_SCALE_BYTES = 2
BIASED_QKV_ARCHS = ("qwen2",)


def bucket_widths(max_width: int) -> list[int]:
    """The widths a static decode step pads its forwards to (pocketspec/torch_model/static_step.py):
    powers of two below max_width, then max_width. On a GPU each is a captured CUDA graph."""
    widths = [1]
    while widths[-1] * 2 < max_width:
        widths.append(widths[-1] * 2)
    return widths + [max_width] if max_width > 1 else widths


def gguf_layout(path) -> tuple[bool, bool]:
    """(is_tied, has_qkv_bias) of a GGUF model, from its tensor table."""
    from memplanner.gguf_header import read_gguf_header  # here: the GPU suite's sizes need no gguf package

    names = {tensor.name for tensor in read_gguf_header(path).tensors}
    return "output.weight" not in names, "blk.0.attn_q.bias" in names


def compute_format(weights_format: str, on_gpu: bool = False) -> str:
    """The float format activations run in: the weights' own, else (int8, int4, auto) fp32 on a CPU and bf16 on a GPU."""
    if weights_format in FLOAT_FORMAT_BYTES:
        return weights_format
    return "bf16" if on_gpu else "fp32"


def resolve_weights_format(weights: str, on_gpu: bool) -> str:
    """What `--weights` loads as: `auto` is fp32 on a CPU (exact greedy verification) and bf16 on a GPU."""
    return compute_format(weights, on_gpu) if weights == AUTO else weights


def lighter_torch_settings(weights_format: str, kv_dtype: str) -> str:
    """What a torch plan that does not fit could try, leaving out what it already has:
    'try --weights int8 or int4, a smaller --max-context, or --torch-kv-type int8'."""
    lighter = {"int8": "int4", "int4": None}.get(weights_format, "int8 or int4")
    options = [f"--weights {lighter}"] if lighter else []
    options.append("a smaller --max-context")
    if kv_dtype != "int8":
        options.append("--torch-kv-type int8")
    return "try " + (f"{', '.join(options[:-1])}, or {options[-1]}" if len(options) > 2 else " or ".join(options))


def compute_dtype_bytes(weights_format: str, on_gpu: bool = False) -> int:
    return FLOAT_FORMAT_BYTES[compute_format(weights_format, on_gpu)]


def linear_bytes(num_in: int, num_out: int, weights_format: str, group_size: int = INT4_GROUP_SIZE) -> int:
    """One [num_out, num_in] weight matrix (no bias) in `weights_format`."""
    if weights_format == "int8":
        return num_out * num_in + num_out * QUANT_SCALE_BYTES
    if weights_format == "int4":
        return num_out * num_in // 2 + 2 * num_out * (num_in // group_size) * QUANT_SCALE_BYTES
    return num_out * num_in * FLOAT_FORMAT_BYTES[weights_format]


def torch_block_tensor_sizes(shape: ModelShape, weights_format: str, *, has_qkv_bias: bool, on_gpu: bool = False,
                             num_heads: int | None = None, num_kv_heads: int | None = None,
                             ffn_dim: int | None = None, group_size: int = INT4_GROUP_SIZE) -> list[int]:
    """Each allocation of one transformer block (a quantized linear's scales counted with it);
    num_heads, num_kv_heads, ffn_dim narrow it to a rank's slice in a row split."""
    compute_bytes = compute_dtype_bytes(weights_format, on_gpu)
    dim = shape.hidden_size
    ffn_dim = shape.intermediate_size if ffn_dim is None else ffn_dim
    q_size = (shape.num_heads if num_heads is None else num_heads) * shape.head_dim
    kv_size = (shape.num_kv_heads if num_kv_heads is None else num_kv_heads) * shape.head_dim

    def linear(num_in: int, num_out: int) -> int:
        return linear_bytes(num_in, num_out, weights_format, group_size)

    found = [linear(dim, q_size), linear(dim, kv_size), linear(dim, kv_size), linear(q_size, dim),
             linear(dim, ffn_dim), linear(dim, ffn_dim), linear(ffn_dim, dim), dim * compute_bytes, dim * compute_bytes]
    return found + ([size * compute_bytes for size in (q_size, kv_size, kv_size)] if has_qkv_bias else [])


def torch_block_bytes(shape: ModelShape, weights_format: str, *, has_qkv_bias: bool, on_gpu: bool = False,
                      num_heads: int | None = None, num_kv_heads: int | None = None, ffn_dim: int | None = None,
                      group_size: int = INT4_GROUP_SIZE) -> int:
    """One transformer block; num_heads, num_kv_heads, ffn_dim narrow it to a rank's slice in a row split."""
    return sum(torch_block_tensor_sizes(shape, weights_format, has_qkv_bias=has_qkv_bias, on_gpu=on_gpu,
                                        num_heads=num_heads, num_kv_heads=num_kv_heads, ffn_dim=ffn_dim,
                                        group_size=group_size))


def torch_embedding_bytes(shape: ModelShape, weights_format: str, on_gpu: bool = False) -> int:
    """The token embeddings (always in the compute dtype) and the rope frequency table (float32)."""
    return shape.vocab_size * shape.hidden_size * compute_dtype_bytes(weights_format, on_gpu) + shape.head_dim // 2 * 4


def torch_head_bytes(shape: ModelShape, weights_format: str, *, is_tied: bool, on_gpu: bool = False,
                     group_size: int = INT4_GROUP_SIZE) -> int:
    """The final norm and an untied output head (a tied head reuses the embeddings)."""
    compute_bytes = compute_dtype_bytes(weights_format, on_gpu)
    head = 0 if is_tied else linear_bytes(shape.hidden_size, shape.vocab_size, weights_format, group_size)
    return shape.hidden_size * compute_bytes + head


def torch_weight_bytes(shape: ModelShape, weights_format: str, *, is_tied: bool, has_qkv_bias: bool | None = None,
                       on_gpu: bool = False, group_size: int = INT4_GROUP_SIZE) -> int:
    if weights_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weights format {weights_format!r}; use one of {', '.join(WEIGHT_FORMATS)}")
    if has_qkv_bias is None:
        has_qkv_bias = shape.arch in BIASED_QKV_ARCHS
    block = torch_block_bytes(shape, weights_format, has_qkv_bias=has_qkv_bias, on_gpu=on_gpu, group_size=group_size)
    return (shape.num_layers * block + torch_embedding_bytes(shape, weights_format, on_gpu)
            + torch_head_bytes(shape, weights_format, is_tied=is_tied, on_gpu=on_gpu, group_size=group_size))


def torch_kv_bytes(shape: ModelShape, kv_dtype: str, max_context: int, *, num_layers: int | None = None,
                   max_batch: int = 1, num_kv_heads: int | None = None) -> int:
    """A static cache: K and V for every layer, batch and position, plus int8's scales."""
    if kv_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPE_BYTES)}")
    per_position = shape.head_dim * KV_DTYPE_BYTES[kv_dtype] + (INT8_KV_SCALE_BYTES if kv_dtype == "int8" else 0)
    num_layers = shape.num_layers if num_layers is None else num_layers
    num_kv_heads = shape.num_kv_heads if num_kv_heads is None else num_kv_heads
    return 2 * num_layers * max_batch * num_kv_heads * max_context * per_position


def torch_memory_terms(shape: ModelShape, *, weights_format: str, kv_dtype: str, max_context: int, is_tied: bool,
                       has_qkv_bias: bool | None = None, on_gpu: bool = False, self_draft: str | None = None,
                       draft_kv_dtype: str | None = None, draft_window: int = 0, draft_layers: int = 0) -> dict[str, int]:
    """Bytes of every tensor the torch backend allocates for this target and its self-draft, by term.

    self-sparse adds a KV cache of `draft_window` positions; self-skip one of `draft_layers`
    layers over the whole context; neither adds weights.
    """
    terms = {"weights": torch_weight_bytes(shape, weights_format, is_tied=is_tied, has_qkv_bias=has_qkv_bias,
                                           on_gpu=on_gpu),
             "target KV": torch_kv_bytes(shape, kv_dtype, max_context)}
    if self_draft == "self-sparse":
        terms["self-sparse KV"] = torch_kv_bytes(shape, draft_kv_dtype or kv_dtype, min(draft_window, max_context))
    elif self_draft == "self-skip":
        terms["self-skip KV"] = torch_kv_bytes(shape, kv_dtype, max_context, num_layers=draft_layers)
    return terms


def torch_tensor_sizes(shape: ModelShape, tensor_terms: dict[str, int], *, weights_format: str, is_tied: bool,
                       has_qkv_bias: bool, on_gpu: bool = False) -> list[int]:
    """Each allocation the model keeps for its lifetime: embeddings, head, every block's tensors, and
    every KV cache of tensor_terms (torch_memory_terms) as one K and one V tensor per layer."""
    compute_bytes = compute_dtype_bytes(weights_format, on_gpu)
    found = [shape.vocab_size * shape.hidden_size * compute_bytes, shape.hidden_size * compute_bytes]
    if not is_tied:
        found.append(linear_bytes(shape.hidden_size, shape.vocab_size, weights_format, compute_bytes))
    found += shape.num_layers * torch_block_tensor_sizes(shape, weights_format, has_qkv_bias=has_qkv_bias,
                                                         on_gpu=on_gpu)
    for name, num_bytes in tensor_terms.items():
        if name != "weights" and num_bytes:
            found += [num_bytes // (2 * shape.num_layers)] * (2 * shape.num_layers)
    return found
