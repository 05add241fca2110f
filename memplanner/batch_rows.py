"""How many sequences batched decoding can hold (KV cache rows) and step together within a memory budget.

Pure arithmetic on model shapes, like torch_sizes.py. On a CPU the process's own terms
(torch, the tokenizer, the loading moment) come from torch_peak.py. Weights are paid once; each
row of the pool costs its static KV cache (the target's, and the draft's); each
sequence in a forward costs activations: its logits rows and the attention working
set over the whole context (the batch-invariant attention keeps a query tile's scores,
probabilities and per-block products; the fast path copies each row's keys and values).
One prompt at a time is prefilled, in chunks of n_batch tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memplanner.defaults import MAX_GAMMA, N_BATCH
from memplanner.gpu_terms import cuda_context_bytes
from memplanner.shapes import ModelShape
from memplanner.sizes import format_bytes, kept_free_text
from memplanner.torch_peak import (CPU_ACTIVATION_FACTOR, activation_bytes, heap_reserve_bytes, loading_bytes,
                                   process_terms)
from memplanner.torch_sizes import (AUTO, KV_DTYPE_BYTES, compute_dtype_bytes, compute_format, torch_kv_bytes,
                                    torch_weight_bytes)

FLOAT32_BYTES = 4


@dataclass(frozen=True)
class BatchWorkload:
    max_context: int  # per sequence, already rounded up to the key block
    max_batch: int  # sequences per forward wanted
    num_rows: int = 0  # sequences held at once wanted (0: max_batch)
    max_gamma: int = MAX_GAMMA
    query_tile: int = 4
    key_block: int = 128
    n_batch: int = N_BATCH


@dataclass(frozen=True)
class BatchPlan:
    feasible: bool
    num_rows: int = 0
    max_batch: int = 0
    terms: dict[str, int] = field(default_factory=dict)
    reason: str = ""  # why not feasible
    notes: tuple[str, ...] = ()  # what was lowered to fit

    @property
    def total_bytes(self) -> int:
        return sum(self.terms.values())


def _hidden_bytes(shape: ModelShape, num_tokens: int) -> int:
    """Hidden states of num_tokens tokens: the feed-forward's three wide tensors and a few model-wide ones."""
    return num_tokens * (3 * max(shape.intermediate_size, shape.hidden_size) + 6 * shape.hidden_size) * FLOAT32_BYTES


def _gathered_kv_bytes(shape: ModelShape, workload: BatchWorkload, kv_dtype: str) -> int:
    """One layer's keys and values of one row, copied out of the cache (dequantized from int8)."""
    return 2 * shape.num_kv_heads * workload.max_context * shape.head_dim * max(KV_DTYPE_BYTES[kv_dtype], 4)


def forward_bytes_per_sequence(shape: ModelShape, workload: BatchWorkload, kv_dtype: str) -> int:
    """Activations one sequence adds to a decoding forward, at the longest context."""
    num_positions = workload.max_gamma + 1
    logits = 2 * num_positions * shape.vocab_size * FLOAT32_BYTES  # the forward's output and its numpy copy
    rows = shape.num_heads * workload.query_tile
    scores = 3 * rows * workload.max_context * FLOAT32_BYTES  # scores, probabilities and a temporary
    num_blocks = -(-workload.max_context // workload.key_block)
    partials = 2 * num_blocks * rows * shape.head_dim * FLOAT32_BYTES  # per-block products and their scan
    hidden = _hidden_bytes(shape, num_positions)
    return logits + scores + partials + _gathered_kv_bytes(shape, workload, kv_dtype) + hidden


def prefill_bytes(shape: ModelShape, workload: BatchWorkload, kv_dtype: str, compute_bytes: int = FLOAT32_BYTES,
                  on_gpu: bool = False) -> int:
    """Activations of one prefill chunk of n_batch tokens: one sequence's forward, as the single-sequence
    plan counts it (torch_peak.activation_bytes: SDPA with a [chunk, context] mask), over the row's keys
    and values copied out of the pool."""
    num_tokens = min(workload.n_batch, workload.max_context)
    return (activation_bytes(shape, num_tokens, workload.max_context, compute_bytes, 1, kv_dtype == "int8", on_gpu)
            + _gathered_kv_bytes(shape, workload, kv_dtype))


def plan_batch(shape: ModelShape, workload: BatchWorkload, *, budget_bytes: int, weights_format: str, kv_dtype: str,
               is_tied: bool, has_qkv_bias: bool | None = None, on_gpu: bool = False,
               draft_shape: ModelShape | None = None, draft_is_tied: bool = False,
               draft_layers: int = 0, draft_window: int = 0, draft_kv_dtype: str | None = None) -> BatchPlan:
    """The most rows (up to the wanted count) and the largest batch that fit, or why not even one does.

    draft_shape: a separate draft model; draft_layers: a self-skip draft's layers (its own KV cache only);
    draft_window: a self-sparse draft's positions per row (every layer, in draft_kv_dtype, else kv_dtype).
    On a CPU the plan keeps torch_peak.heap_reserve_bytes free under the budget.
    """
    reserve_bytes = heap_reserve_bytes(on_gpu)
    usable_bytes = budget_bytes - reserve_bytes
    fixed = {"weights": torch_weight_bytes(shape, weights_format, is_tied=is_tied, has_qkv_bias=has_qkv_bias,
                                           on_gpu=on_gpu)}
    per_row = {"target KV": torch_kv_bytes(shape, kv_dtype, workload.max_context)}
    if draft_shape is not None:
        fixed["draft weights"] = torch_weight_bytes(draft_shape, weights_format, is_tied=draft_is_tied, on_gpu=on_gpu)
        per_row["draft KV"] = torch_kv_bytes(draft_shape, kv_dtype, workload.max_context)
    elif draft_layers:
        per_row["self-skip KV"] = torch_kv_bytes(shape, kv_dtype, workload.max_context, num_layers=draft_layers)
    elif draft_window:
        per_row["self-sparse KV"] = torch_kv_bytes(shape, draft_kv_dtype or kv_dtype, draft_window)
    fixed = {**process_terms(shape, on_gpu, weights_format), **fixed}
    if on_gpu:  # the device gives the process its context too (gpu_terms.py)
        fixed["cuda context"] = cuda_context_bytes(on_gpu)
    # glibc keeps what differently shaped forwards freed: on a CPU both terms get the single-sequence factor
    heap_factor = 1.0 if on_gpu else CPU_ACTIVATION_FACTOR
    prefill = prefill_bytes(shape, workload, kv_dtype, compute_dtype_bytes(weights_format, on_gpu), on_gpu)
    fixed["prefill activations"] = int(heap_factor * prefill)
    row_bytes = sum(per_row.values())
    sequence_bytes = int(heap_factor * forward_bytes_per_sequence(shape, workload, kv_dtype))
    fixed_bytes = sum(fixed.values())
    # loading comes before the KV rows exist: the peak is the larger of the two moments
    loading = loading_bytes(shape, weights_format, on_gpu)
    wanted_rows = max(workload.num_rows or workload.max_batch, workload.max_batch)
    for max_batch in range(workload.max_batch, 0, -1):
        room = usable_bytes - fixed_bytes - max_batch * sequence_bytes
        num_rows = min(wanted_rows, room // row_bytes) if room > 0 else 0
        fits_loading = usable_bytes >= fixed_bytes - fixed["prefill activations"] + loading
        if num_rows >= max_batch and fits_loading:
            break
    else:
        one_row = fixed_bytes - fixed["prefill activations"] + max(fixed["prefill activations"] + row_bytes
                                                                   + sequence_bytes, loading)
        parts = ", ".join(f"{name} {format_bytes(size)}" for name, size in {**fixed, **per_row}.items())
        return BatchPlan(False, reason=f"--memory-budget {format_bytes(budget_bytes)} cannot hold even one sequence "
                                       f"({parts}, activations {format_bytes(sequence_bytes)}, or while loading "
                                       f"{format_bytes(loading)} beside the weights: {format_bytes(one_row)}"
                                       f"{kept_free_text(reserve_bytes)}); "
                                       "lower --max-context or try --weights int8")
    terms = {**fixed, **{f"{name} × {num_rows} rows": size * num_rows for name, size in per_row.items()},
             f"activations × {max_batch}": sequence_bytes * max_batch}
    terms["loading_excess"] = max(0, loading - sum(terms.values()) + fixed_bytes - fixed["prefill activations"])
    notes = []
    if max_batch < workload.max_batch:
        notes.append(f"--batch lowered from {workload.max_batch} to {max_batch} to fit")
    if num_rows < wanted_rows:
        notes.append(f"KV cache rows lowered from {wanted_rows} to {num_rows} to fit")
    return BatchPlan(True, num_rows, max_batch, terms, notes=tuple(notes))


def kv_dtype_for(kv_dtype: str, weights_format: str, on_gpu: bool) -> str:
    """What `auto` KV means: the weights' compute dtype (fp32 on a CPU for the integer formats)."""
    return compute_format(weights_format, on_gpu) if kv_dtype == AUTO else kv_dtype
