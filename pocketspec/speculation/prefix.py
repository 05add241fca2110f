"""Longest common prefix of two token lists, the basis of every KV reuse, and the whole-chunk rule of
the batch rows and a server's engine (a row reuses only the prefill chunks a fresh prefill computes alike)."""

from __future__ import annotations

from typing import Sequence


def common_prefix_length(cached: Sequence[int], wanted: Sequence[int]) -> int:
    limit = min(len(cached), len(wanted))
    if list(cached[:limit]) == list(wanted[:limit]):  # the usual case, compared in C
        return limit
    low, high = 0, limit  # a prefix matches, so bisect on equality of prefixes
    while low < high:
        middle = (low + high + 1) // 2
        if list(cached[:middle]) == list(wanted[:middle]):
            low = middle
        else:
            high = middle - 1
    return low


def reusable_whole_chunks(cached: Sequence[int], num_exact: int, prompt: Sequence[int], n_batch: int) -> int:
    """Leading tokens of `prompt` among a row's first num_exact cached tokens (those prefilled in whole
    n_batch chunks from position 0), in whole chunks, leaving at least one token to prefill."""
    shared = min(common_prefix_length(cached[:num_exact], prompt), len(prompt) - 1)
    return max(0, shared - shared % n_batch)


def exact_after_chunk(num_exact: int, start: int, chunk_length: int, n_batch: int) -> int:
    """A row's num_exact after prefilling chunk_length tokens from `start`: one more whole chunk where the
    chunk is whole and follows the exact ones at a multiple of n_batch."""
    is_next_whole_chunk = chunk_length == n_batch and num_exact == start and start % n_batch == 0
    return start + chunk_length if is_next_whole_chunk else num_exact


def exact_after_prefill(num_exact: int, start: int, num_tokens: int, n_batch: int) -> int:
    """A row's num_exact after a prefill of num_tokens from `start` in n_batch chunks (Backend.prefill)."""
    num_exact = min(num_exact, start)
    for chunk_start in range(start, start + num_tokens, n_batch):
        num_exact = exact_after_chunk(num_exact, chunk_start, min(n_batch, start + num_tokens - chunk_start), n_batch)
    return num_exact
