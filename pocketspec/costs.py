"""Measured seconds per forward pass by width, learned online from this machine's own timings.

Widths never seen yet are predicted from a prior cost shape (relative to one
token) scaled by what has been measured.
"""

from __future__ import annotations

from memplanner.costs import CPU_REFERENCES, interpolate

# Cost of a forward pass of w tokens relative to one token, from the planner's CPU
# reference (qwen2.5-coder-1.5b, memplanner.costs.CPU_REFERENCES): a prior until this machine is measured.
_REFERENCE = CPU_REFERENCES[0].seconds_by_width
CPU_PRIOR_RATIO = {width: seconds / _REFERENCE[1] for width, seconds in _REFERENCE.items()}


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
        self._scale_sum += seconds / interpolate(self.prior_ratio, width)
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
        return scale * interpolate(self.prior_ratio, width)
