"""Measured seconds per forward pass by width, learned online from this machine's own timings.

Widths never seen yet are predicted from a prior cost shape (relative to one
token) scaled by what has been measured.
"""

from __future__ import annotations

import bisect

# Cost of a forward pass of width w relative to width 1: qwen2.5-coder-1.5b on the
# 2-core CPU with llama-cpp-python 0.3.36 (MODELS.md, 2026-11-21).
CPU_PRIOR_RATIO = {1: 1.0, 2: 1.53, 3: 1.96, 5: 2.02, 9: 3.36, 17: 4.64}


def _interpolate(table: dict[int, float], width: int) -> float:
    widths = sorted(table)
    if width <= widths[0]:
        return table[widths[0]]
    if width >= widths[-1]:
        last, before = widths[-1], widths[-2]
        slope = (table[last] - table[before]) / (last - before)
        return table[last] + slope * (width - last)
    right = bisect.bisect_left(widths, width)
    low, high = widths[right - 1], widths[right]
    if high == width:
        return table[high]
    share = (width - low) / (high - low)
    return table[low] + share * (table[high] - table[low])


class CostTable:
    """Seconds for one forward pass of `width` tokens on one backend."""

    def __init__(self, prior_ratio: dict[int, float] | None = None, smoothing: float = 0.2):
        self.prior_ratio = prior_ratio or CPU_PRIOR_RATIO
        self.smoothing = smoothing
        self._seconds_by_width: dict[int, float] = {}
        self._scale_sum = 0.0
        self._scale_count = 0

    def observe(self, width: int, seconds: float) -> None:
        previous = self._seconds_by_width.get(width)
        if previous is None:
            self._seconds_by_width[width] = seconds
        else:
            self._seconds_by_width[width] = previous + self.smoothing * (seconds - previous)
        self._scale_sum += seconds / _interpolate(self.prior_ratio, width)
        self._scale_count += 1

    @property
    def is_measured(self) -> bool:
        return self._scale_count > 0

    def seconds(self, width: int) -> float:
        if width <= 0:
            return 0.0
        measured = self._seconds_by_width.get(width)
        if measured is not None:
            return measured
        scale = self._scale_sum / self._scale_count if self._scale_count else 0.08
        return scale * _interpolate(self.prior_ratio, width)
