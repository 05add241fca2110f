"""Seconds per forward pass by width and cached depth: this machine's calibrated table, refined online.

With a calibrated table (memplanner/measured_costs.py, measured by pocketspec/calibrate.py)
the prediction is the table's cost at that width and depth times a correction learned from
the passes this run has timed: the machine's load drifts, the curve's shape does not.
Without one, widths never seen are predicted from a prior cost shape (relative to one token)
scaled by what has been measured.
"""

from __future__ import annotations

import math

from memplanner.costs import CPU_REFERENCES, interpolate
from memplanner.measured_costs import MeasuredCosts

# Cost of a forward pass of w tokens relative to one token, from the planner's CPU
# reference (qwen2.5-coder-1.5b, memplanner.costs.CPU_REFERENCES): a prior until this machine is measured.
_REFERENCE = CPU_REFERENCES[0].seconds_by_width
CPU_PRIOR_RATIO = {width: seconds / _REFERENCE[1] for width, seconds in _REFERENCE.items()}


MIN_WIDTH_OBSERVATIONS = 3  # timed passes of one width before its own correction replaces the shared one
DEPTH_BUCKET = 32  # cached tokens over which one calibrated cost is used


class CostTable:
    """Seconds for one forward pass of `width` tokens after `depth` cached tokens, on one backend."""

    def __init__(self, measured: MeasuredCosts | None = None, prior_ratio: dict[int, float] | None = None,
                 smoothing: float = 0.2):
        self.measured = measured
        self.prior_ratio = prior_ratio or CPU_PRIOR_RATIO
        self.smoothing = smoothing
        self._seconds_by_width: dict[int, float] = {}
        self._scale_sum = 0.0
        self._scale_count = 0
        self._log_correction = 0.0  # log(observed / calibrated), smoothed over every width
        self._factor = 1.0  # exp(_log_correction)
        self._calibrated_cache: dict[tuple[int, int], float] = {}
        # per width, once seen often enough: a table measured on a busy machine heals where it is used
        self._width_corrections: dict[int, tuple[int, float]] = {}
        self._width_factors: dict[int, float] = {}  # exp(correction) of the widths seen often enough

    def observe(self, width: int, seconds: float, depth: int = 0) -> None:
        if width <= 0 or seconds <= 0:
            return
        if self.measured is not None:
            predicted = self._calibrated(width, depth)
            if predicted > 0:
                error = math.log(seconds / predicted)
                self._log_correction += self.smoothing * (error - self._log_correction)
                self._factor = math.exp(self._log_correction)
                count, correction = self._width_corrections.get(width, (0, error))
                correction += self.smoothing * (error - correction)
                self._width_corrections[width] = (count + 1, correction)
                if count + 1 >= MIN_WIDTH_OBSERVATIONS:
                    self._width_factors[width] = math.exp(correction)
            return
        previous = self._seconds_by_width.get(width)
        if previous is None:
            self._seconds_by_width[width] = seconds
        else:
            self._seconds_by_width[width] = previous + self.smoothing * (seconds - previous)
        self._scale_sum += seconds / interpolate(self.prior_ratio, width)
        self._scale_count += 1

    def _calibrated(self, width: int, depth: int) -> float:
        """The calibrated table's cost, read once per width and DEPTH_BUCKET of cached tokens: the
        controller asks for up to 32 widths every step, and attention grows slowly with depth."""
        key = (width, depth // DEPTH_BUCKET)
        cost = self._calibrated_cache.get(key)
        if cost is None:
            cost = self._calibrated_cache[key] = self.measured.forward_seconds(width, key[1] * DEPTH_BUCKET)
        return cost

    @property
    def is_measured(self) -> bool:
        return self.measured is not None or self._scale_count > 0

    def seconds(self, width: int, depth: int = 0) -> float:
        if width <= 0:
            return 0.0
        if self.measured is not None:
            return self._calibrated(width, depth) * self._width_factors.get(width, self._factor)
        measured = self._seconds_by_width.get(width)
        if measured is not None:
            return measured
        scale = self._scale_sum / self._scale_count if self._scale_count else 0.08
        return scale * interpolate(self.prior_ratio, width)
