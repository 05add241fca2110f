"""One pure function per memory term, in bytes, for the llama.cpp backend (torch: torch_sizes.py).

Sizes are what llama.cpp allocates (its logged buffer sizes) or what RSS shows after a
model is loaded; benchmarks/calibrate_memory.py checked them against llama-cpp-python
0.3.36 on CPU. Allocation sizes are upper bounds: pages never touched stay off RSS.
"""

from __future__ import annotations

from memplanner import constants
from memplanner.defaults import LLAMA_KV_TYPES
from memplanner.shapes import ModelShape

FLOAT32_BYTES = 4
FLOAT64_BYTES = 8
# Each of defaults.LLAMA_KV_TYPES: (elements per block, bytes per block)
KV_TYPE_BLOCKS = {"f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}
# Python objects of a generation beside llama.cpp's buffers: token lists, glibc arenas of the
# decode threads, the argmax of each verified row. A single sequence reads its logits rows in
# place (a view of llama.cpp's output buffer); a server's copies are counted with its sequences
# (pocketspec/budget/sequences_plan.py). Counting a float32 copy of the rows as well put the plans
# of 32-row verifies 5.6-9 % over their measured peaks (memory grid, 2026-11-25).
GENERATION_WORKING_SET_BYTES = 4 * 1024 * 1024
# ... and per context token: the loop's token lists (the context, the backend's cached tokens, the
# prompt's slices). tracemalloc measured 1533 B a token of Python memory in all while generating
# after 8100 tokens (2026-11-25): 880 B of them the n-gram index, the flat term above about 520.
CONTEXT_BYTES_PER_TOKEN = 160
# The suffix drafter's index (n = 1..8, pocketspec/drafters/suffix_index.py) and its token list, a
# bound for any text: with bytes for keys, tracemalloc measured 771-849 B a token on random tokens
# (every n-gram new, the most it holds) over 4096-131072 tokens, 994 B at most just after its dict grew
# (300000 tokens read 2500 at a time), and 803 B on the recorded traces' most varied 4096-token slice
# (2026-11-28; with tuples for keys: 974-1038, 1181 and 955 B)
NGRAM_INDEX_BYTES_PER_TOKEN = 1050
# The cross-request corpus of earlier outputs (pocketspec/drafters/corpus.py), one per process: past
# this many tokens its oldest outputs are dropped
NGRAM_CORPUS_MAX_TOKENS = 1 << 14


def padded_context(n_ctx: int, pad: int = constants.LLAMA_CPP_N_CTX_PAD) -> int:
    """KV cells llama.cpp allocates for n_ctx: rounded up to a multiple of 256."""
    return -(-n_ctx // pad) * pad


def kv_row_bytes(kv_type: str, num_elements: int) -> int:
    """Bytes of one K (or V) row of num_elements in a llama.cpp KV type (whole blocks)."""
    if kv_type not in LLAMA_KV_TYPES:
        raise ValueError(f"unknown KV type {kv_type!r}: use one of {', '.join(LLAMA_KV_TYPES)}")
    block_elements, block_bytes = KV_TYPE_BLOCKS[kv_type]
    return -(-num_elements // block_elements) * block_bytes


def kv_cache_bytes(shape: ModelShape, n_ctx: int, type_k: str = "f16", type_v: str | None = None,
                   num_seqs: int = 1) -> int:
    """num_layers x padded n_ctx x (K row + V row), one cache per sequence."""
    row_elements = shape.kv_elements_per_token
    per_token = kv_row_bytes(type_k, row_elements) + kv_row_bytes(type_v or type_k, row_elements)
    return num_seqs * shape.num_layers * padded_context(n_ctx) * per_token


def loads_without_mmap(shape: ModelShape, device_kind: str, repack_weights: bool) -> bool:
    """Whether llama.cpp reads the GGUF into memory instead of mapping it (the backend asks here too).

    With the weights repacked for the CPU kernels, an mmapped GGUF keeps the file's pages of the
    repacked tensors resident beside their repacked copy: 1.81 GB VmHWM against 1.21 GB read
    without mmap on the 1.5B target (issue 14, llama-cpp-python 0.3.36). Read, each tensor exists once.
    """
    return device_kind == "cpu" and repack_weights and shape.repacked_bytes > 0


def resident_weights_bytes(shape: ModelShape, device_kind: str = "cpu", repack_weights: bool = False) -> int:
    """The weights outside the repack buffer. An mmapped GGUF on CPU becomes resident in full
    (llama.cpp prefetches it); read without mmap, only the tensors not repacked; on a GPU the tensors."""
    if loads_without_mmap(shape, device_kind, repack_weights):
        return shape.weight_bytes - shape.repacked_bytes
    return shape.file_bytes if device_kind == "cpu" else shape.weight_bytes


def repacked_weights_bytes(shape: ModelShape, device_kind: str = "cpu") -> int:
    """Anonymous copies of Q4_0/Q4_K/IQ4_NL weights in the CPU_REPACK buffer."""
    return shape.repacked_bytes if device_kind == "cpu" else 0


def model_metadata_bytes(shape: ModelShape) -> int:
    """Vocabulary tables and tensor metadata llama.cpp builds at load (fitted per vocab entry)."""
    return constants.MODEL_METADATA_BYTES_PER_VOCAB * shape.vocab_size + constants.MODEL_METADATA_BASE_BYTES


def output_buffer_bytes(shape: ModelShape, logits_rows: int) -> int:
    """llama.cpp's output buffer: float32 logits for the rows flagged in the largest batch."""
    return max(1, logits_rows) * shape.vocab_size * FLOAT32_BYTES


def sequences_logits_bytes(shape: ModelShape, num_sequences: int, logits_rows: int) -> int:
    """What num_sequences sharing one llama.cpp context add to one sequence's logits_rows: the output buffer
    holds every sequence's rows, and each round hands every sequence a copy of its own."""
    return output_buffer_bytes(shape, num_sequences * logits_rows) * 2 - output_buffer_bytes(shape, logits_rows)


def logits_all_bytes(shape: ModelShape, n_ctx: int) -> int:
    """llama-cpp-python's `scores` with logits_all=True: n_ctx x vocab float32 (the naive way)."""
    return n_ctx * shape.vocab_size * FLOAT32_BYTES


def target_probs_bytes(shape: ModelShape, gamma: int, temperature: float) -> int:
    """float64 distributions of the verified rows, at most gamma + 1 of them (each computed when
    the rule first reads it, pocketspec/speculation/verify.py)."""
    return (gamma + 1) * shape.vocab_size * FLOAT64_BYTES if temperature > 0 and gamma > 0 else 0


def compute_buffer_bytes(shape: ModelShape, n_ubatch: int, n_ctx: int, n_outputs: int,
                         flash_attn: bool = True) -> int:
    """llama.cpp CPU compute buffer, reserved at context creation for the worst ubatch.

    ggml-alloc reuses memory, so the size is the largest of three peaks (coefficients fitted
    by benchmarks/fit_memory.py): the logits of n_outputs rows, the feed-forward block and,
    without flash attention, the f32 KQ scores of every head over the whole context.
    """
    ubatch = min(n_ubatch, n_ctx)  # llama.cpp clamps n_batch (and so n_ubatch) to n_ctx
    outputs = min(max(1, n_outputs), ubatch)
    kv_cells = padded_context(n_ctx)
    output_peak = FLOAT32_BYTES * (outputs * shape.vocab_size
                                   + constants.COMPUTE_OUTPUT_HIDDEN * ubatch * shape.hidden_size)
    ffn_peak = FLOAT32_BYTES * ubatch * (constants.COMPUTE_FFN * shape.intermediate_size
                                         + constants.COMPUTE_FFN_HIDDEN * shape.hidden_size)
    peaks = [output_peak, ffn_peak + 2 * ubatch * kv_cells]  # + the f16 KQ mask
    if not flash_attn:
        peaks.append(FLOAT32_BYTES * (ubatch * kv_cells * (shape.num_heads + 1)
                                      + constants.COMPUTE_KQ_HIDDEN * ubatch * shape.hidden_size))
    return int(max(peaks)) + constants.COMPUTE_CONST_BYTES[flash_attn]


def process_base_bytes(device_kind: str = "cpu") -> int:
    """The Python interpreter and the CLI's own modules, before any backend library or model: part
    of the whole-process peak a CPU budget bounds; host memory, so no part of a GPU's budget."""
    return constants.PROCESS_BASE_BYTES if device_kind == "cpu" else 0


# Transparent huge pages (on by default where THP is `madvise`: pocketspec/huge_pages.py; and in every
# process where THP is `always`) fault memory in 2 MiB at a time, so a mapping touched in part (a malloc
# arena, the heap, a buffer's last page) is resident in whole huge pages. Measured with and without them
# (benchmarks/memory_grid.py's runs, 2-core Zen 5 EPYC, 2026-12-01): 3.2 MB more peak RSS for SmolLM2
# decoding plainly, 5.2-5.7 MB for the qwen 1.5B, 4.5-5.9 MB for it with its 0.5B draft; one huge page more.
HUGE_PAGE_ROUNDING_BYTES = 8 * 1024 * 1024


def huge_page_rounding_bytes(device_kind: str = "cpu") -> int:
    """What huge pages add to the whole process's peak RSS: part of a CPU budget."""
    return HUGE_PAGE_ROUNDING_BYTES if device_kind == "cpu" else 0


def runtime_overhead_bytes(device_kind: str = "cpu") -> int:
    """Python, numpy and llama.cpp libraries (CPU, measured); CUDA context (GPU, estimated)."""
    if device_kind == "cpu":
        return constants.RUNTIME_OVERHEAD_BYTES["cpu"]
    return constants.ESTIMATED_CUDA_OVERHEAD_BYTES


def working_set_bytes(max_context: int) -> int:
    """The Python side of a generation beside llama.cpp's buffers (see GENERATION_WORKING_SET_BYTES)."""
    return GENERATION_WORKING_SET_BYTES + CONTEXT_BYTES_PER_TOKEN * max_context


def ngram_index_bytes(max_context: int) -> int:
    """The n-gram drafter's lookup table over the context (Python dicts, measured)."""
    return NGRAM_INDEX_BYTES_PER_TOKEN * max_context


def ngram_corpus_bytes() -> int:
    """The same table over the corpus of earlier outputs, full: one a process, shared by its engines."""
    return NGRAM_INDEX_BYTES_PER_TOKEN * NGRAM_CORPUS_MAX_TOKENS


def draft_context_tokens(window: int, gamma: int) -> int:
    """Draft KV slots: the kept window (attention sinks + recent tokens) plus gamma + 1 in flight."""
    return window + gamma + 1
