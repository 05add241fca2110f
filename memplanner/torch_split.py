"""Per-device bytes of the torch backend over several devices, and the layer split they allow.

Pure arithmetic on a ModelShape, exact like torch_sizes.py. Layer split: the first device holds
the token embeddings and the rope table, the last the final norm and the output head (for a tied
model a copy of the embeddings, unless first and last are one device), and every device its run
of blocks with their KV cache and the self-draft's KV for those blocks. Blocks go to devices by
the room each budget leaves (split.assign_layers). Row split: every rank holds its slice of every
block's heads (whole key/value groups) and feed-forward columns, the KV cache of its heads, and
whole embeddings, norm and head. On GPUs each device also holds the activations of the widest
forward (the logits on the device with the head), the buffers that pass activations on (the
hidden states a layer split hands over, a row split's all-reduces), the allocator's reserve and
its own CUDA context (gpu_terms.py). On cpu:N devices, with counts_process, the process's own terms
(torch_peak.py: the interpreter, torch, the tokenizer, the widest forward's activations, the GGUF
mapped while loading) go on the first device of a layer split, whose devices share one process,
and on every rank of a row split, each rank a process of its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from memplanner import gpu_terms
from memplanner.defaults import MAX_GAMMA, N_BATCH
from memplanner.shapes import ModelShape
from memplanner.sizes import format_bytes
from memplanner.split import DeviceBudget, DeviceShare, assign_layers, even_layer_counts
from memplanner.torch_peak import activation_bytes, torch_peak_terms
from memplanner.torch_sizes import (compute_dtype_bytes, lighter_torch_settings, torch_block_bytes,
                                    torch_block_tensor_sizes, torch_embedding_bytes, torch_head_bytes, torch_kv_bytes)

# A row split's rank on a CPU beside what one process of the torch backend holds (cpu_process_terms):
# torch.distributed, its gloo groups and the command channel. Measured with SmolLM2 over cpu:0,cpu:1, torch
# 2.13 CPU, Zen 4 EPYC, 2026-12-07 (VmHWM of each rank against its plan without this term): 122 and 94 MiB.
ROW_RANK_DISTRIBUTED_BYTES = 128 * 1024 * 1024
# The terms that are tensors the backend keeps (what memory_by_device reports); the rest are transient or
# outside torch's tensors.
TENSOR_TERMS = ("target_blocks", "target_kv_cache", "self_sparse_kv", "self_skip_kv", "embeddings", "output_head")
KV_TERMS = ("target_kv_cache", "self_sparse_kv", "self_skip_kv")


@dataclass(frozen=True)
class TorchLayout:
    """What the torch backend allocates per block: formats, context, and the self-draft's cache."""

    weights_format: str
    kv_dtype: str
    max_context: int
    is_tied: bool
    has_qkv_bias: bool
    on_gpu: bool = False
    self_draft: str | None = None  # self-sparse | self-skip
    draft_kv_dtype: str | None = None
    draft_window: int = 0
    draft_layers: int = 0
    n_batch: int = N_BATCH  # the widest prefill chunk
    max_logits_rows: int = MAX_GAMMA + 1  # the widest verify


@dataclass
class TorchSplitPlan:
    feasible: bool
    reason: str
    shares: list[DeviceShare] = field(default_factory=list)

    @property
    def layers_per_device(self) -> tuple[int, ...]:
        return tuple(share.num_layers for share in self.shares)

    def to_dict(self) -> dict:
        found = asdict(self)
        found["predicted_peak_bytes"] = {share.device: share.peak_bytes for share in self.shares}
        return found


def tensor_bytes(share: DeviceShare) -> int:
    """The bytes of the tensors a device keeps, without activations, buffers and GPU terms."""
    return sum(size for name, size in share.terms.items() if name in TENSOR_TERMS)


def _gpu_terms(shape: ModelShape, layout: TorchLayout, tensor_sizes: list[int], *, holds_head: bool,
               buffer_bytes: int) -> dict[str, int]:
    """A GPU's terms beside its tensors: activations of the widest forward (prefill chunk or verify; the
    logits only where the head is), the buffers passing activations on, the allocator's reserve, the context."""
    compute_bytes = compute_dtype_bytes(layout.weights_format, on_gpu=True)
    kv_is_int8 = _kv_is_int8(layout)
    widths = [(min(layout.n_batch, layout.max_context), 1), (layout.max_logits_rows, layout.max_logits_rows)]
    activations = max(activation_bytes(shape, num_tokens, layout.max_context, compute_bytes,
                                       rows if holds_head else 0, kv_is_int8, on_gpu=True)
                      for num_tokens, rows in widths)
    found = {"activations": activations, "activation_buffers": buffer_bytes,
             "allocator_reserve": gpu_terms.allocator_reserve_bytes(tensor_sizes, activations + buffer_bytes),
             "cuda_context": gpu_terms.cuda_context_bytes(True)}
    return {name: size for name, size in found.items() if size}


def cpu_process_terms(shape: ModelShape, layout: TorchLayout, tensor_terms: list[dict[str, int]], *,
                      has_tokenizer: bool = True) -> dict[str, int]:
    """What a CPU process holds beside its tensors (`tensor_terms`, summed; their KV caches bound the loading's
    excess): torch_peak's terms but the tensors. has_tokenizer: False for a row split's follower."""
    kv = sum(size for terms in tensor_terms for name, size in terms.items() if name in KV_TERMS)
    peak = torch_peak_terms(shape, {"kv": kv}, weights_format=layout.weights_format, max_context=layout.max_context,
                            n_batch=layout.n_batch, max_logits_rows=layout.max_logits_rows,
                            kv_is_int8=_kv_is_int8(layout), is_tied=layout.is_tied)
    left_out = {"kv"} | (set() if has_tokenizer else {"tokenizer"})
    return {name: size for name, size in peak.items() if name not in left_out and size}


def _kv_is_int8(layout: TorchLayout) -> bool:
    return "int8" in (layout.kv_dtype, layout.draft_kv_dtype if layout.self_draft else layout.kv_dtype)


def _widest(layout: TorchLayout) -> int:
    return max(min(layout.n_batch, layout.max_context), layout.max_logits_rows)


def _block_terms(shape: ModelShape, layout: TorchLayout, layer: int) -> dict[str, int]:
    terms = {"target_blocks": torch_block_bytes(shape, layout.weights_format, has_qkv_bias=layout.has_qkv_bias,
                                                on_gpu=layout.on_gpu),
             "target_kv_cache": torch_kv_bytes(shape, layout.kv_dtype, layout.max_context, num_layers=1)}
    draft_kv_dtype = layout.draft_kv_dtype or layout.kv_dtype
    if layout.self_draft == "self-sparse":
        terms["self_sparse_kv"] = torch_kv_bytes(shape, draft_kv_dtype, min(layout.draft_window, layout.max_context),
                                                 num_layers=1)
    elif layout.self_draft == "self-skip" and layer < layout.draft_layers:
        terms["self_skip_kv"] = torch_kv_bytes(shape, layout.kv_dtype, layout.max_context, num_layers=1)
    return terms


def _fixed_terms(shape: ModelShape, layout: TorchLayout, index: int, devices: list[DeviceBudget]) -> dict[str, int]:
    fixed = {}
    if index == 0:
        fixed["embeddings"] = torch_embedding_bytes(shape, layout.weights_format, layout.on_gpu)
    if index == len(devices) - 1:
        fixed["output_head"] = torch_head_bytes(shape, layout.weights_format, is_tied=layout.is_tied,
                                                on_gpu=layout.on_gpu)
        if layout.is_tied and len(devices) > 1:  # the last device's own copy of the embeddings
            fixed["output_head"] += (shape.vocab_size * shape.hidden_size
                                     * compute_dtype_bytes(layout.weights_format, layout.on_gpu))
    return fixed


def _refusal(shape: ModelShape, layout: TorchLayout, devices: list[DeviceBudget], needed: int,
             mode: str) -> TorchSplitPlan:
    listed = ", ".join(f"{device.name} {format_bytes(device.budget_bytes)}" for device in devices)
    return TorchSplitPlan(False, f"{shape.name} does not fit across {listed} with a {mode} split of the torch "
                                 f"backend ({format_bytes(needed)} in all); raise a budget, add a device, "
                                 f"or {lighter_torch_settings(layout.weights_format, layout.kv_dtype)}")


def plan_layer_split(devices: list[DeviceBudget], shape: ModelShape, layout: TorchLayout,
                     layers_per_device: tuple[int, ...] = (), counts_process: bool = False) -> TorchSplitPlan:
    """Blocks per device by room (or as given), each device's terms, or a refusal naming the total.
    counts_process: on CPUs, the one process's own terms too, on the first device (without them: the tensors
    alone, as memory_by_device reports them)."""
    blocks = [_block_terms(shape, layout, layer) for layer in range(shape.num_layers)]
    fixed = [_fixed_terms(shape, layout, index, devices) for index in range(len(devices))]
    if counts_process and not layout.on_gpu:
        fixed[0].update(cpu_process_terms(shape, layout, blocks + fixed))
    room = [device.budget_bytes - sum(terms.values()) for device, terms in zip(devices, fixed)]
    counts = list(layers_per_device) or assign_layers([sum(terms.values()) for terms in blocks], room)
    needed = sum(sum(terms.values()) for terms in blocks + fixed)
    if counts is None:
        return _refusal(shape, layout, devices, needed, "layer")
    shares, first = [], 0
    compute_bytes = compute_dtype_bytes(layout.weights_format, layout.on_gpu)
    block_tensors = torch_block_tensor_sizes(shape, layout.weights_format, has_qkv_bias=layout.has_qkv_bias,
                                             on_gpu=layout.on_gpu)
    for index, (device, count, device_fixed) in enumerate(zip(devices, counts, fixed)):
        terms = dict(device_fixed)
        for block in blocks[first:first + count]:
            for name, size in block.items():
                terms[name] = terms.get(name, 0) + size
        if layout.on_gpu:
            kv_tensors = [size // 2 for block in blocks[first:first + count] for name, size in block.items()
                          if name != "target_blocks" for _ in range(2)]
            handoff = gpu_terms.layer_handoff_bytes(_widest(layout), shape.hidden_size, compute_bytes) if index else 0
            terms.update(_gpu_terms(shape, layout, count * block_tensors + kv_tensors + list(device_fixed.values()),
                                    holds_head=index == len(devices) - 1, buffer_bytes=handoff))
        shares.append(DeviceShare(device.name, device.budget_bytes, first, count, False, terms))
        first += count
    is_feasible = all(share.peak_bytes <= share.budget_bytes for share in shares)
    reason = "" if is_feasible else _refusal(shape, layout, devices, needed, "layer").reason
    return TorchSplitPlan(is_feasible, reason, shares)


def _shard(num_units: int, world_size: int, rank: int) -> int:
    return even_layer_counts(num_units, world_size)[rank]


def plan_row_split(devices: list[DeviceBudget], shape: ModelShape, layout: TorchLayout,
                   counts_process: bool = False) -> TorchSplitPlan:
    """Each rank's slice of every block, its KV heads, and whole embeddings and head. counts_process: on CPUs,
    each rank's process's own terms too."""
    world_size = len(devices)
    group_size = shape.num_heads // shape.num_kv_heads
    shares = []
    for rank, device in enumerate(devices):
        num_kv_heads = _shard(shape.num_kv_heads, world_size, rank)
        block = torch_block_bytes(shape, layout.weights_format, has_qkv_bias=layout.has_qkv_bias, on_gpu=layout.on_gpu,
                                  num_heads=num_kv_heads * group_size, num_kv_heads=num_kv_heads,
                                  ffn_dim=_shard(shape.intermediate_size, world_size, rank))
        terms = {"target_blocks": shape.num_layers * block,
                 "target_kv_cache": torch_kv_bytes(shape, layout.kv_dtype, layout.max_context, num_kv_heads=num_kv_heads),
                 "embeddings": torch_embedding_bytes(shape, layout.weights_format, layout.on_gpu),
                 "output_head": torch_head_bytes(shape, layout.weights_format, is_tied=layout.is_tied,
                                                 on_gpu=layout.on_gpu)}
        if layout.on_gpu:
            compute_bytes = compute_dtype_bytes(layout.weights_format, True)
            block_tensors = torch_block_tensor_sizes(
                shape, layout.weights_format, has_qkv_bias=layout.has_qkv_bias, on_gpu=True,
                num_heads=num_kv_heads * group_size, num_kv_heads=num_kv_heads,
                ffn_dim=_shard(shape.intermediate_size, world_size, rank))
            kv_tensors = [terms["target_kv_cache"] // (2 * shape.num_layers)] * (2 * shape.num_layers)
            reduce = gpu_terms.all_reduce_bytes(_widest(layout), shape.hidden_size, compute_bytes, world_size, True)
            terms.update(_gpu_terms(shape, layout, shape.num_layers * block_tensors + kv_tensors
                                    + [terms["embeddings"], terms["output_head"]], holds_head=True,
                                    buffer_bytes=reduce))
        elif counts_process:
            terms.update(cpu_process_terms(shape, layout, [terms], has_tokenizer=rank == 0))
            terms["distributed_runtime"] = ROW_RANK_DISTRIBUTED_BYTES
        shares.append(DeviceShare(device.name, device.budget_bytes, 0, shape.num_layers, False, terms))
    if all(share.peak_bytes <= share.budget_bytes for share in shares):
        return TorchSplitPlan(True, "", shares)
    needed = sum(share.peak_bytes for share in shares)
    return TorchSplitPlan(False, _refusal(shape, layout, devices, needed, "row").reason, shares)
