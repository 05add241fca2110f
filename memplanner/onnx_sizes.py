"""Bytes the ONNX Runtime backend holds, by term: pure arithmetic on a ModelShape.

Weights are the exported file's (pocketspec/onnx_model/graph.py): every linear layer as a
MatMul in the format, int4 as MatMulNBits (4-bit values and one float32 scale per block of 32
inputs); embeddings, norms and biases stay float (fp32 beside int4), and a tied model stores
its head once (int4 keeps the float matrix for the embedding lookup beside the quantized head).

At run time (measured by benchmarks/onnx_memory_grid.py with onnxruntime 1.32 on a 2-core AMD EPYC,
SmolLM2-135M and Qwen2.5-Coder-0.5B):
- with prepacking off, ONNX Runtime maps the weights file and reads it in place, so the resident
  weights are at most the file; an int4 MatMulNBits then dequantizes each weight as it runs, and
  the largest (the head) lives as float32 for a moment;
- a separate embedding matrix (an untied model's, or the float one beside an int4 head) is read only
  at the rows of the tokens seen, so of it only those pages are resident (Qwen2.5-0.5B's is 519 MiB,
  of which 4096 positions touch at most 32 MiB);
- with prepacking on (its default, faster), it copies every MatMul weight into its kernels' layout
  while the file is mapped: PREPACKED_WEIGHT_FACTOR x the file bounds what that holds (int4's
  MatMulNBits holds more);
- fp16 on the CPU provider is cast to fp32 where ORT lacks fp16 kernels: CPU_FP16_WEIGHT_FACTOR.

The KV cache is the backend's own fixed-capacity buffers. A step's activations are dominated by
attention's scores, heads × new tokens × cached tokens float32, of which ATTENTION_SCORE_COPIES
live at once. The CPU arena is off (pocketspec/backends/onnx_backend.py), so a step's buffers
are freed after it. On the grid, 13 of 14 runs peaked at 0.87-0.99 of the prediction and one at 1.05 (glibc's
heap keeps freed buffers by amounts that vary between runs), so the budget keeps a reserve free beside it
(pocketspec/budget/onnx_plan.py).
"""

from __future__ import annotations

from memplanner.shapes import ModelShape
from memplanner.torch_sizes import compute_dtype_bytes  # 2 for fp16, else 4 (fp32 beside int4 on a CPU)

ONNX_FORMATS = ("fp32", "fp16", "int4")
INT4_BLOCK_SIZE = 32  # MatMulNBits block: ONNX Runtime's CPU kernels are tuned for 32 (and 128)
INT4_BLOCK_BYTES = INT4_BLOCK_SIZE // 2 + 4  # packed values and a float32 scale (symmetric: no zero point)
RUNTIME_BYTES = 170 * 2**20  # the interpreter, numpy, onnxruntime, llama.cpp's tokenizer, the session
ATTENTION_SCORE_COPIES = 3.1  # scores, masked scores and their softmax
HIDDEN_ROW_COPIES = 0.8  # per new token: its hidden states and feed-forward intermediates
EXPANDED_KEY_COPIES = 2  # keys and values over the whole context, joined and repeated to every query head
PAGE_BYTES = 4096
# resident weights (but a lookup table) with prepacking over the file: fp32 (SmolLM2 measured 1.14), int4 (1.5, 1.6)
PREPACKED_WEIGHT_FACTOR = {"fp32": 1.2, "fp16": 1.2, "int4": 1.7}
CPU_FP16_WEIGHT_FACTOR = 2.5  # fp16 weights and the fp32 casts of those ORT's CPU kernels need


def resolve_onnx_format(weights: str, provider: str) -> str:
    """What --weights exports as: `auto` is fp32 on the CPU provider (ORT's CPU kernels for fp16 are few), fp16 on
    a GPU's."""
    if weights != "auto":
        return weights
    return "fp32" if provider == "cpu" else "fp16"


def onnx_linear_bytes(num_in: int, num_out: int, weights_format: str) -> int:
    """One [num_in, num_out] MatMul weight."""
    if weights_format == "int4":
        return num_out * -(-num_in // INT4_BLOCK_SIZE) * INT4_BLOCK_BYTES
    return num_in * num_out * compute_dtype_bytes(weights_format)


def onnx_weight_bytes(shape: ModelShape, weights_format: str, *, is_tied: bool, has_qkv_bias: bool) -> int:
    """The exported weights file, in bytes."""
    if weights_format not in ONNX_FORMATS:
        raise ValueError(f"unknown ONNX weights format {weights_format!r}; use one of {', '.join(ONNX_FORMATS)}")
    dim, ffn, vocab = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    plain = compute_dtype_bytes(weights_format)  # norms, biases and the embedding lookup (fp32 beside int4)
    block = (onnx_linear_bytes(dim, q_size, weights_format) + 2 * onnx_linear_bytes(dim, kv_size, weights_format)
             + onnx_linear_bytes(q_size, dim, weights_format) + 2 * onnx_linear_bytes(dim, ffn, weights_format)
             + onnx_linear_bytes(ffn, dim, weights_format) + 2 * dim * plain
             + ((q_size + 2 * kv_size) * plain if has_qkv_bias else 0))
    head = onnx_linear_bytes(dim, vocab, weights_format)
    embedding = 0 if is_tied and weights_format != "int4" else vocab * dim * plain
    rope = shape.head_dim // 2 * 4  # the rotation frequencies, float32
    return shape.num_layers * block + head + embedding + dim * plain + rope


def onnx_kv_bytes(shape: ModelShape, weights_format: str, max_context: int) -> int:
    """Keys and values of every layer and position, in the compute dtype (fp32 beside int4)."""
    per_position = shape.num_kv_heads * shape.head_dim * compute_dtype_bytes(weights_format)
    return 2 * shape.num_layers * max_context * per_position


def onnx_step_bytes(shape: ModelShape, *, n_batch: int, max_context: int, max_logits_rows: int) -> int:
    """The largest step's activations: a prompt chunk of n_batch tokens over a full context, or the widest verify."""
    num_tokens = min(n_batch, max_context)
    scores = ATTENTION_SCORE_COPIES * 4 * shape.num_heads * num_tokens * max_context
    hidden = HIDDEN_ROW_COPIES * 4 * num_tokens * (2 * shape.intermediate_size + 4 * shape.hidden_size)
    keys = EXPANDED_KEY_COPIES * 2 * 4 * shape.num_heads * max_context * shape.head_dim
    logits = 2 * 4 * max_logits_rows * shape.vocab_size  # the graph's logits and their copy to numpy
    return int(scores + hidden + keys + logits)


def lookup_table_bytes(shape: ModelShape, weights_format: str, *, is_tied: bool) -> int:
    """The embedding matrix that only the token lookup reads (0 where the head's own matrix serves it)."""
    if is_tied and weights_format != "int4":
        return 0
    return shape.vocab_size * shape.hidden_size * compute_dtype_bytes(weights_format)


def looked_up_bytes(shape: ModelShape, weights_format: str, *, is_tied: bool, max_context: int) -> int:
    """What the lookup table holds resident: mapped, it is read only at the rows of the tokens seen, at most
    one per position, each over at most one page more than its own bytes."""
    table = lookup_table_bytes(shape, weights_format, is_tied=is_tied)
    row_pages = -(-shape.hidden_size * compute_dtype_bytes(weights_format) // PAGE_BYTES) + 1
    return min(table, max_context * row_pages * PAGE_BYTES)


def onnx_resident_weight_bytes(shape: ModelShape, weights_format: str, *, is_tied: bool, has_qkv_bias: bool,
                               prepacks: bool, on_cpu: bool) -> int:
    """What the weights but the lookup table hold in memory at their peak (a bound: module docstring)."""
    weights = (onnx_weight_bytes(shape, weights_format, is_tied=is_tied, has_qkv_bias=has_qkv_bias)
               - lookup_table_bytes(shape, weights_format, is_tied=is_tied))
    if weights_format == "fp16" and on_cpu:
        weights *= CPU_FP16_WEIGHT_FACTOR
    if prepacks:
        weights *= PREPACKED_WEIGHT_FACTOR[weights_format]
    elif weights_format == "int4":
        weights += shape.hidden_size * shape.vocab_size * 4  # the head dequantized as it runs
    return int(weights)


def onnx_peak_terms(shape: ModelShape, *, weights_format: str, max_context: int, n_batch: int, max_logits_rows: int,
                    is_tied: bool, has_qkv_bias: bool, prepacks: bool, on_cpu: bool = True) -> dict[str, int]:
    """Every term of the predicted peak RSS, by name."""
    return {"runtime": RUNTIME_BYTES,
            "weights": onnx_resident_weight_bytes(shape, weights_format, is_tied=is_tied, has_qkv_bias=has_qkv_bias,
                                                  prepacks=prepacks, on_cpu=on_cpu),
            "embedding rows": looked_up_bytes(shape, weights_format, is_tied=is_tied, max_context=max_context),
            "KV cache": onnx_kv_bytes(shape, weights_format, max_context),
            "activations": onnx_step_bytes(shape, n_batch=n_batch, max_context=max_context,
                                           max_logits_rows=max_logits_rows)}
