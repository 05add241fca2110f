"""What a GPU holds for the torch backend beyond the bytes its tensors allocate.

nvidia-smi (and another process that wants the memory) sees a process's CUDA context plus
everything torch's caching allocator has *reserved*; torch.cuda.max_memory_allocated counts
neither. Three terms close the gap: the context, the allocator's rounding and reserve, and in a
split the buffers that carry activations between devices. The allocator's rules are those of
c10's CUDACachingAllocator (torch 2.x): every request is rounded up to 512 bytes; a request of
at most 1 MiB comes out of 2 MiB segments, one under 10 MiB out of 20 MiB segments, and a larger
one gets a segment of its own, rounded up to 2 MiB. Freed blocks stay reserved for reuse.
benchmarks/memory_grid_torch.py --device cuda measures each term (max_memory_allocated,
max_memory_reserved and the change in mem_get_info) and is how the estimates below get checked.
"""

from __future__ import annotations

from memplanner.sizes import round_up

MIB = 1024 * 1024
# Not measured (no GPU lent yet): a CUDA 12 context with lazily loaded kernels, cuBLAS and
# cuBLASLt workspaces and torch's own kernels is commonly 300-500 MiB; the larger is planned.
TORCH_CUDA_CONTEXT_BYTES = 512 * MIB
BLOCK_BYTES = 512  # kMinBlockSize
SMALL_REQUEST_BYTES = 1 * MIB  # kSmallSize: served from SMALL_SEGMENT_BYTES segments
SMALL_SEGMENT_BYTES = 2 * MIB  # kSmallBuffer
MEDIUM_REQUEST_BYTES = 10 * MIB  # kMinLargeAlloc: below it, requests share MEDIUM_SEGMENT_BYTES segments
MEDIUM_SEGMENT_BYTES = 20 * MIB  # kLargeBuffer
LARGE_ROUND_BYTES = 2 * MIB  # kRoundLarge
# Activations are freed and reallocated every forward at changing sizes (the KV length grows),
# so the blocks they leave cached fragment: an estimate to be checked by the GPU memory grid.
ACTIVATION_FRAGMENTATION = 0.5
# NCCL's buffers per peer and channel (NCCL_BUFFSIZE default 4 MiB, 2 channels between two
# GPUs, sending and receiving), allocated by NCCL outside torch's allocator.
NCCL_BUFFER_BYTES_PER_PEER = 2 * 2 * 4 * MIB




def allocator_reserve_bytes(tensor_sizes: list[int], activation_bytes: int = 0) -> int:
    """Reserved minus allocated for tensors that live as long as the model (weights, KV caches) and the
    activations of the widest forward: each tensor's rounding and the unused end of its segments."""
    small = sum(round_up(size, BLOCK_BYTES) for size in tensor_sizes if size <= SMALL_REQUEST_BYTES)
    medium = sum(round_up(size, BLOCK_BYTES) for size in tensor_sizes
                 if SMALL_REQUEST_BYTES < size < MEDIUM_REQUEST_BYTES)
    large = sum(round_up(size, LARGE_ROUND_BYTES) for size in tensor_sizes if size >= MEDIUM_REQUEST_BYTES)
    reserved = (round_up(small, SMALL_SEGMENT_BYTES) + round_up(medium, MEDIUM_SEGMENT_BYTES) + large)
    return reserved - sum(tensor_sizes) + int(ACTIVATION_FRAGMENTATION * activation_bytes)


def cuda_context_bytes(on_gpu: bool) -> int:
    """The CUDA context of one process on one GPU (outside the allocator); nothing on a CPU."""
    return TORCH_CUDA_CONTEXT_BYTES if on_gpu else 0


def layer_handoff_bytes(num_tokens: int, hidden_size: int, compute_bytes: int) -> int:
    """A layer split hands the hidden states [num_tokens, hidden] to the next device: the copy it receives."""
    return num_tokens * hidden_size * compute_bytes


def all_reduce_bytes(num_tokens: int, hidden_size: int, compute_bytes: int, world_size: int,
                     on_gpu: bool) -> int:
    """A row split's all-reduce: the partial sum it reduces in place and its output copy, plus NCCL's own
    buffers for every peer on a GPU (gloo's on a CPU are small and in the process's heap)."""
    tensors = 2 * num_tokens * hidden_size * compute_bytes
    return tensors + (NCCL_BUFFER_BYTES_PER_PEER * (world_size - 1) if on_gpu else 0)
