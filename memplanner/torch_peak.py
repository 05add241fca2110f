"""The torch backend's peak memory: its tensors (torch_sizes.py) plus everything around them.

On a CPU the peak is the whole process's resident memory. Four things are always there:
the interpreter with the CLI's modules, the torch library, llama.cpp's vocabulary (the
tokenizer) and the Python side of a generation. Then comes the larger of two moments. Loading: the weights, the GGUF mapped
in full and the float32 staging of one chunk of rows. Generating: the weights, the KV
caches and the activations of the widest forward. On a GPU the peak is what the device gives
the process: the allocated bytes (torch.cuda.max_memory_allocated: weights, KV caches,
activations and the staging of a chunk), the allocator's rounding and reserve on top
(max_memory_reserved) and the CUDA context (memplanner/gpu_terms.py); gpu_views tells them
apart. The host side of a GPU run is not in it.
"""

from __future__ import annotations

from typing import Sequence

from memplanner import gpu_terms, terms
from memplanner.shapes import ModelShape
from memplanner.torch_sizes import INT8_DEQUANTIZE_SLICE_BYTES, bucket_widths, compute_dtype_bytes, compute_format

# RSS that `import torch` adds to the CLI's baseline: torch 2.13.0+cpu on the 2-core
# x86_64 CPU, measured 2026-11-23 (184.0 MiB in each of 8 runs).
TORCH_CPU_RUNTIME_BYTES = 184 * 1024 * 1024
# float32 rows dequantized at once (pocketspec/torch_model/gguf_weights.py). Staging beside
# the weights while loading SmolLM2 with 16 MiB chunks, measured 2026-11-23: 7-10 MiB for
# float formats, 25-26 MiB for int8/int4 (quantizing a chunk takes float32 temporaries).
DEQUANTIZE_CHUNK_BYTES = 16 * 1024 * 1024
LOAD_STAGING_CHUNKS = {"int8": 2, "int4": 2}  # float formats: one chunk
# glibc keeps freed activation buffers of a long prefill in its heap (malloc_trim returned
# 118 MiB after an 8192-token int8 prefill of SmolLM2) and some temporaries are not in
# activation_bytes: measured CPU peaks were up to 1.35x the formula (2026-11-23). Since 2026-12-07 load_model
# fixes glibc's mmap threshold (pocketspec/torch_model/glibc_heap.py), so large freed buffers leave the heap;
# the factor is as measured before that.
CPU_ACTIVATION_FACTOR = 1.5
# What a budget keeps free beyond the predicted CPU peak: glibc's heap does not return the
# same amount twice. Repeated runs of one SmolLM2 configuration peaked up to 25 MiB apart,
# and the largest peak above its prediction was 10 MiB (int8 weights and KV, context 8192),
# 2026-11-23. With huge pages and the whole process counted (2026-12-06, Zen 4 EPYC,
# benchmarks/memory_grid_torch.py): that configuration peaked 674-728 MiB over 12 runs (28 MiB
# above its prediction at most), and fp32 self-sparse at 2048 tokens 38 MiB above its own while a
# C++ build ran beside it. A GPU allocator's peak repeats exactly: no reserve.
CPU_HEAP_RESERVE_BYTES = 48 * 1024 * 1024
# A static step samples on the device (pocketspec/torch_model/device_sampling.py): a verify of `rows` rows
# holds at most about this many [rows, vocab] float64/int64 tensors at once beside its logits (the
# probabilities, top-p's sorted copy and order, or the race's uniforms). Measured on CPU torch 2.13, Zen 4
# EPYC, 2026-12-06, with large allocations unmapped on free (benchmarks/device_sampling_memory.py): at
# most 4.00 (33 rows x 49,152, top-p 0.95), 3.90 at 33 x 151,936, 2.90-3.03 without top-p.
SAMPLING_TEMPORARIES = 4
# On a GPU, unmeasured so far: the CPU's figure plus 2 for CUDA's segmented sort (its own buffers for
# indices and CUB's temporary storage), an allowance that the GPU suite's "Sampled verify" table checks.
GPU_SAMPLING_TEMPORARIES = 6
# A bf16 linear on a CPU runs a oneDNN primitive built for its input's row count, with its JIT kernel,
# cached (pocketspec/torch_model/onednn_caches.py bounds the caches to this many entries each). SmolLM2-135M
# bf16 over widths 1-128 at that bound: 57 MiB above its first forward's start, flat from width 64 on
# (torch 2.13 CPU, Zen 4 EPYC, 2026-12-07), of which about 5 MiB is the first forward's own set-up.
ONEDNN_CACHED_PRIMITIVES = 48
ONEDNN_PRIMITIVE_BYTES = 1152 * 1024


def heap_reserve_bytes(on_gpu: bool) -> int:
    """Kept free under the budget beside the predicted peak (not part of the prediction)."""
    return 0 if on_gpu else CPU_HEAP_RESERVE_BYTES


def load_staging_bytes(weights_format: str) -> int:
    return LOAD_STAGING_CHUNKS.get(weights_format, 1) * DEQUANTIZE_CHUNK_BYTES


def loading_bytes(shape: ModelShape, weights_format: str, on_gpu: bool) -> int:
    """Beside the weights while loading: a chunk's staging, and on a CPU the GGUF mapped in full."""
    return load_staging_bytes(weights_format) + (0 if on_gpu else shape.file_bytes)


def process_terms(shape: ModelShape, on_gpu: bool, weights_format: str) -> dict[str, int]:
    """What a CPU process holds whatever it generates: the interpreter and the CLI, torch, the
    tokenizer, the Python side, and with 2-byte float weights oneDNN's cached kernels (counted in the loading
    moment too, which makes none). None of it is in a GPU allocator's peak."""
    if on_gpu:
        return {}
    found = {"process_base": terms.process_base_bytes("cpu"), "torch_runtime": TORCH_CPU_RUNTIME_BYTES,
             "tokenizer": terms.runtime_overhead_bytes("cpu") + terms.model_metadata_bytes(shape),
             "working_set": terms.GENERATION_WORKING_SET_BYTES}  # the logits copies are in activation_bytes
    if compute_format(weights_format) in ("bf16", "fp16"):  # fp16 too where the CPU has AVX512-FP16 or AMX-FP16
        found["onednn_kernels"] = ONEDNN_CACHED_PRIMITIVES * ONEDNN_PRIMITIVE_BYTES
    return found


def quantized_matmul_bytes(shape: ModelShape, weights_format: str, compute_bytes: int, is_tied: bool,
                           num_tokens: int, on_gpu: bool = False) -> int:
    """What an int8 / int4 linear allocates in a call beyond the activations (quant_kernels.py).

    On a CPU the fused kernels read the quantized weight in place, with bf16 copies of their
    input rows and bf16 results: at most the down projection's, num_tokens x (ffn + dim) x 2.
    An int4 linear whose output count is not a multiple of 16 has no CPU kernel and
    dequantizes its weight instead. On a GPU a fused kernel depends on the torch build and
    the GPU, and int8 prompt chunks dequantize by design: the largest weight dequantized,
    the worst case.
    """
    if weights_format not in ("int8", "int4"):
        return 0
    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    dim, ffn_dim = shape.hidden_size, shape.intermediate_size
    weights = [(dim, q_size), (dim, kv_size), (q_size, dim), (dim, ffn_dim), (ffn_dim, dim)]  # (in, out)
    weights += [] if is_tied else [(dim, shape.vocab_size)]
    if not on_gpu and weights_format == "int4":
        weights = [(num_in, num_out) for num_in, num_out in weights if num_out % 16]
    elif not on_gpu:
        weights = []
    # the weight in the compute dtype, and once more for the scaling
    dequantized = max((2 * num_in * num_out * compute_bytes for num_in, num_out in weights), default=0)
    return dequantized + (0 if on_gpu else 2 * num_tokens * (ffn_dim + dim))


def activation_bytes(shape: ModelShape, num_tokens: int, context: int, compute_bytes: int, logits_rows: int,
                     kv_is_int8: bool = False, on_gpu: bool = False) -> int:
    """One forward of num_tokens over `context` cached positions, at its widest point.

    Hidden states and the SwiGLU block in the compute dtype, RoPE in float32, the boolean
    causal mask and its float copy, keys and values repeated to every query head (grouped-query
    attention), int8 keys and values dequantized once for the whole context (straight to the
    compute dtype, kv_cache.py), and the logits rows in the compute dtype and in float32. CPU
    SDPA runs a fused kernel: no score matrix. On a GPU, one query runs unmasked and several
    run with keys and values repeated to every head (model.causal_attention), so CUDA's fused
    kernels apply; where none serves (a ROCm build without them) SDPA falls back to the math
    kernel, which holds the scores and their softmax in float32: counted, as the worst case.
    """
    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    hidden = compute_bytes * num_tokens * (4 * shape.hidden_size + 3 * shape.intermediate_size)
    rope = 4 * 3 * num_tokens * (q_size + kv_size)
    mask = num_tokens * context * (1 + 4)
    repeated_kv = 2 * context * q_size * compute_bytes if shape.num_kv_heads < shape.num_heads else 0
    dequantized = 2 * context * kv_size * compute_bytes if kv_is_int8 else 0
    logits = logits_rows * shape.vocab_size * (compute_bytes + 4)
    scores = 2 * shape.num_heads * num_tokens * context * 4 if on_gpu else 0
    return hidden + rope + mask + repeated_kv + dequantized + logits + scores


def device_sampling_bytes(vocab_size: int, rows: int, on_gpu: bool = False) -> int:
    """A static step's sampled verify of `rows` rows beyond its logits: float64 and int64 [rows, vocab]
    temporaries (top-p's sort the widest). Counted whatever the temperature: a server's requests choose it."""
    return (GPU_SAMPLING_TEMPORARIES if on_gpu else SAMPLING_TEMPORARIES) * rows * vocab_size * 8


def graph_pool_bytes(shape: ModelShape, max_width: int, context: int, compute_bytes: int, kv_is_int8: bool,
                     weights_format: str) -> int:
    """The CUDA graphs of one GPU static step (pocketspec/torch_model/static_step.py): one private pool
    shared by the graph of every width (torch_sizes.bucket_widths). Each graph keeps its output, the
    logits [width, vocab] in float32; their temporaries reuse one another's memory, since replays never
    overlap: the widest forward's activations over the whole cache (the step attends over all of it),
    and an int8 verify's dequantized weight slice."""
    widths = bucket_widths(max_width)
    kept_logits = sum(widths) * shape.vocab_size * 4
    transient = activation_bytes(shape, widths[-1], context, compute_bytes, widths[-1], kv_is_int8, on_gpu=True)
    if weights_format == "int8" and widths[-1] > 1:
        transient += INT8_DEQUANTIZE_SLICE_BYTES
    return kept_logits + transient


def torch_peak_terms(shape: ModelShape, tensor_terms: dict[str, int], *, weights_format: str, max_context: int,
                     n_batch: int, max_logits_rows: int, kv_is_int8: bool = False, on_gpu: bool = False,
                     is_tied: bool = True, tensor_sizes: list[int] = (),
                     static_steps: Sequence[tuple[int, int]] = ()) -> dict[str, int]:
    """Every term of the peak, with tensor_terms from torch_sizes.torch_memory_terms and, on a GPU, each
    lasting allocation's size (torch_sizes.torch_tensor_sizes) for the allocator's rounding.

    static_steps: (widest width, context) of each static step (the target's, a self-draft's); on a GPU
    their forwards replay CUDA graphs from pools of their own (graph_pool_bytes), beside the eager
    prompt chunks' activations and the sampled verify's temporaries (device_sampling_bytes), which then
    are the only ones the allocator serves.

    The terms add up to the peak: `loading_excess` is what the loading moment needs beyond
    the KV caches and activations of the generating moment (usually nothing).
    """
    compute_bytes = compute_dtype_bytes(weights_format, on_gpu)
    prefill = activation_bytes(shape, min(n_batch, max_context), max_context, compute_bytes, 1, kv_is_int8, on_gpu)
    verify = activation_bytes(shape, max_logits_rows, max_context, compute_bytes, max_logits_rows, kv_is_int8,
                              on_gpu)
    graph_pools = sum(graph_pool_bytes(shape, width, context, compute_bytes, kv_is_int8, weights_format)
                      for width, context in static_steps) if on_gpu else 0
    # sampling runs after a verify's forward, whose activations are free by then
    sampling = device_sampling_bytes(shape.vocab_size, max_logits_rows, on_gpu) if static_steps else 0
    if graph_pools:
        activations = max(prefill, sampling)
    else:
        widest = max(prefill, verify, sampling)
        activations = widest if on_gpu else int(CPU_ACTIVATION_FACTOR * widest)
    activations += quantized_matmul_bytes(shape, weights_format, compute_bytes, is_tied,
                                          max(min(n_batch, max_context), max_logits_rows), on_gpu)
    kv_total = sum(value for name, value in tensor_terms.items() if name != "weights")
    loading = loading_bytes(shape, weights_format, on_gpu)
    found = process_terms(shape, on_gpu, weights_format)
    found.update(tensor_terms)
    found["activations"] = activations
    if graph_pools:
        found["graph_pools"] = graph_pools
    found["loading_excess"] = max(0, loading - kv_total - activations - graph_pools)
    if on_gpu:
        found["allocator_reserve"] = gpu_terms.allocator_reserve_bytes(list(tensor_sizes), activations)
        found["cuda_context"] = gpu_terms.cuda_context_bytes(on_gpu)
    return found


def gpu_views(peak_terms: dict[str, int]) -> dict[str, int]:
    """A GPU peak as each measurement sees it: allocated (max_memory_allocated), reserved
    (max_memory_reserved) and device (what mem_get_info loses: reserved plus the CUDA context)."""
    reserve, context = peak_terms.get("allocator_reserve", 0), peak_terms.get("cuda_context", 0)
    allocated = sum(peak_terms.values()) - reserve - context
    return {"allocated": allocated, "reserved": allocated + reserve, "device": allocated + reserve + context}
