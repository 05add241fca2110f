"""Longest common prefix of two token lists, the basis of every KV reuse."""

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
