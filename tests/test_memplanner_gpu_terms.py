"""memplanner.gpu_terms: the caching allocator's rounding and reserve, the CUDA context and the split buffers,
by hand on c10's rules."""

from __future__ import annotations

from memplanner.gpu_terms import (ACTIVATION_FRAGMENTATION, NCCL_BUFFER_BYTES_PER_PEER, TORCH_CUDA_CONTEXT_BYTES,
                                  all_reduce_bytes, allocator_reserve_bytes, cuda_context_bytes, layer_handoff_bytes)

MIB = 2**20


def test_large_tensors_get_segments_rounded_to_2_mib():
    assert allocator_reserve_bytes([10 * MIB]) == 0
    assert allocator_reserve_bytes([10 * MIB + 1]) == 2 * MIB - 1
    assert allocator_reserve_bytes([10 * MIB + 1, 30 * MIB - 5]) == 2 * MIB - 1 + 5


def test_medium_tensors_share_20_mib_segments_and_small_ones_2_mib():
    assert allocator_reserve_bytes([3 * MIB] * 6) == 20 * MIB - 18 * MIB  # six fill one 20 MiB segment
    assert allocator_reserve_bytes([3 * MIB] * 7) == 40 * MIB - 21 * MIB  # the seventh opens another
    assert allocator_reserve_bytes([1000] * 3) == 2 * MIB - 3000
    # each takes 1024 bytes (512-byte blocks): 2048 fill a 2 MiB segment, the next opens another
    assert allocator_reserve_bytes([1000] * 2049) == 4 * MIB - 2049 * 1000
    assert allocator_reserve_bytes([]) == 0


def test_activations_add_their_fragmentation():
    assert allocator_reserve_bytes([10 * MIB], activation_bytes=8 * MIB) == int(ACTIVATION_FRAGMENTATION * 8 * MIB)


def test_context_and_split_buffers():
    assert cuda_context_bytes(True) == TORCH_CUDA_CONTEXT_BYTES and cuda_context_bytes(False) == 0
    assert layer_handoff_bytes(512, 1536, 2) == 512 * 1536 * 2
    assert all_reduce_bytes(9, 1536, 2, 2, on_gpu=False) == 2 * 9 * 1536 * 2
    assert all_reduce_bytes(9, 1536, 2, 4, on_gpu=True) == 2 * 9 * 1536 * 2 + 3 * NCCL_BUFFER_BYTES_PER_PEER
