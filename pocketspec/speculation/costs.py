"""Seconds per forward pass by width and cached depth: this machine's calibrated table, refined online.

With a calibrated table (memplanner/measured_costs.py, measured by pocketspec/calibrate.py)
the prediction is the table's cost at that width and depth times a correction learned from
the passes this run has timed. A width timed often enough has its own correction; one that was
not takes its nearest timed neighbours' (a table measured during a busy spell is off over a run
of widths, not at one), else the correction shared by every width. Without a table, widths never
seen are predicted from a prior cost shape (relative to one token) scaled by what has been measured.

A table can condemn a width that is in truth cheap, and a controller that only trusts it would
never time that width and never learn. So the controller chooses on optimistic_seconds: a width
whose group of widths (EXPLORATION_GROUPS: neighbours share kernels and corrections) was timed n
times looks EXPLORATION / (1 + n) cheaper than predicted (optimism under uncertainty), and is
tried where it comes near the best choice; the optimism fades as the group is timed, so the curve
is learned in a bounded number of steps. On the recorded code edits replayed against the EPYC's
table inflated 1.5x from 5 rows (benchmarks/replay_drafting.py), 16 rows were learned to within
1 % in 200 steps; without the optimism they stayed 1.5x too dear. The optimism starts only after
EXPLORE_AFTER_PASSES timed passes: a process's first answer may be a dozen tokens (Spec-Bench's
extractions), and one exploring step in each group of widths then cost it 30 % of its speed.
What one run learned, its corrections and how far it explored, a later run adopts (learned(),
adopt(); pocketspec/learned_costs.py keeps it between sessions), so exploring is paid once a
table, not once a process.
"""

from __future__ import annotations

import bisect
import math

from memplanner.costs import CPU_REFERENCES, interpolate
from memplanner.measured_costs import MeasuredCosts

# Cost of a forward pass of w tokens relative to one token, from the planner's CPU
# reference (qwen2.5-coder-1.5b, memplanner.costs.CPU_REFERENCES): a prior until this machine is measured.
_REFERENCE = CPU_REFERENCES[0].seconds_by_width
CPU_PRIOR_RATIO = {width: seconds / _REFERENCE[1] for width, seconds in _REFERENCE.items()}


MIN_WIDTH_OBSERVATIONS = 3  # timed passes of one width before its own correction replaces the shared one
DEPTH_BUCKET = 32  # cached tokens over which one calibrated cost is used
# How much cheaper than predicted a width of a never-timed group looks to the controller: enough to
# try a width that a table measured on a busy machine made 1.5x too dear (issue 38)
EXPLORATION = 0.6
EXPLORE_AFTER_PASSES = 32  # timed passes before any width looks cheaper than predicted
EXPLORATION_GROUPS = (1, 2, 3, 4, 5, 9, 17)  # lower edges of the groups of widths explored together
# The most timed passes a later run adopts for one width or group (learned(), adopt()): what it adopts still
# moves with what it times, and a group it adopts still looks EXPLORATION / (1 + 16) cheaper once it explores
MAX_ADOPTED_PASSES = 16
MAX_ADOPTED_LOG_CORRECTION = 3.0  # a correction past e^±3 (20x) is no correction but a broken file


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
        self._factor_widths: list[int] = []  # those widths, ascending: a width's neighbours are a bisection away
        # each prediction, by width then depth bucket, until an observe changes it (the controller asks for up
        # to 64 widths a step, and a prediction takes a dozen lookups); an observe forgets only the widths whose
        # correction it moved (_moved_widths), and finds them among the widths, not among every depth's entries
        self._predicted: dict[int, dict[int, float]] = {}
        self.num_observed: dict[int, int] = {}  # timed passes by width
        self._num_observed_by_group: dict[int, int] = {}
        # each group's share of its predicted cost once the optimism starts (EXPLORE_AFTER_PASSES)
        self._optimism = [1.0 - EXPLORATION] * len(EXPLORATION_GROUPS)
        self._num_timed = 0  # timed passes of every width

    def observe(self, width: int, seconds: float, depth: int = 0) -> None:
        if width <= 0 or seconds <= 0:
            return
        self.num_observed[width] = self.num_observed.get(width, 0) + 1
        self._num_timed += 1
        group = _exploration_group(width)
        self._num_observed_by_group[group] = self._num_observed_by_group.get(group, 0) + 1
        self._optimism[group] = 1.0 - EXPLORATION / (1 + self._num_observed_by_group[group])
        if self.measured is not None:
            moved = None  # every width
            predicted = self._calibrated(width, depth)
            if predicted > 0:
                error = math.log(seconds / predicted)
                self._log_correction += self.smoothing * (error - self._log_correction)
                self._factor = math.exp(self._log_correction)
                count, correction = self._width_corrections.get(width, (0, error))
                correction += self.smoothing * (error - correction)
                self._width_corrections[width] = (count + 1, correction)
                if count + 1 >= MIN_WIDTH_OBSERVATIONS:
                    if width in self._width_factors:
                        moved = self._moved_widths(width)
                    else:
                        bisect.insort(self._factor_widths, width)
                    self._width_factors[width] = math.exp(correction)
                elif self._width_factors:
                    moved = range(0)  # a width not yet its own, where others are: the shared correction is unused
            self._forget(moved)
            return
        self._forget(None)
        previous = self._seconds_by_width.get(width)
        if previous is None:
            self._seconds_by_width[width] = seconds
        else:
            self._seconds_by_width[width] = previous + self.smoothing * (seconds - previous)
        self._scale_sum += seconds / interpolate(self.prior_ratio, width)
        self._scale_count += 1

    def learned(self) -> dict | None:
        """What the passes timed so far taught about the calibrated table, for a later run to adopt()
        (pocketspec/learned_costs.py keeps it); None without a calibrated table or a timed pass."""
        if self.measured is None or not self._num_observed_by_group:
            return None
        return {"log_correction": self._log_correction,
                "widths": {str(width): [min(count, MAX_ADOPTED_PASSES), correction]
                           for width, (count, correction) in sorted(self._width_corrections.items())},
                "groups": {str(EXPLORATION_GROUPS[group]): min(count, MAX_ADOPTED_PASSES)
                           for group, count in sorted(self._num_observed_by_group.items())}}

    def adopt(self, learned: dict) -> None:
        """Start from what an earlier run's learned() kept, as if this run had timed those passes: its corrections
        of the calibrated table, and its groups of widths explored (they look cheaper only by what is left of their
        optimism). ValueError, and nothing adopted, when `learned` is not what learned() makes."""
        try:
            log_correction = float(learned["log_correction"])
            corrections = {int(width): (int(count), float(correction))
                           for width, (count, correction) in learned["widths"].items()}
            groups = {EXPLORATION_GROUPS.index(int(edge)): int(count) for edge, count in learned["groups"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"not a cost table's learned corrections: {error}") from None
        logs = [log_correction, *(correction for _, correction in corrections.values())]
        counts = [*(count for count, _ in corrections.values()), *groups.values()]
        if self.measured is None or not all(abs(value) <= MAX_ADOPTED_LOG_CORRECTION for value in logs) \
                or not all(1 <= count <= MAX_ADOPTED_PASSES for count in counts) or min(corrections, default=1) < 1:
            raise ValueError("not a cost table's learned corrections: a value out of range, or no calibrated table")
        self._log_correction, self._factor = log_correction, math.exp(log_correction)
        self._width_corrections = corrections
        self._width_factors = {width: math.exp(correction) for width, (count, correction) in corrections.items()
                               if count >= MIN_WIDTH_OBSERVATIONS}
        self._factor_widths = sorted(self._width_factors)
        self._num_observed_by_group = groups
        self._optimism = [1.0 - EXPLORATION / (1 + groups.get(group, 0)) for group in range(len(EXPLORATION_GROUPS))]
        self._forget(None)

    def _moved_widths(self, width: int) -> range:
        """The widths whose correction is `width`'s own (a timed width whose correction changed) or read
        from it: those between it and its timed neighbours, and every one past it where it is the last."""
        widths = self._factor_widths
        index = bisect.bisect_left(widths, width)
        lower = widths[index - 1] if index > 0 else 0
        upper = widths[index + 1] if index + 1 < len(widths) else 1 << 30
        return range(lower + 1, upper)

    def _forget(self, moved: range | None) -> None:
        """Drop the predictions of the `moved` widths (every one when None)."""
        if moved is None:
            self._predicted.clear()
            return
        for width in [width for width in self._predicted if width in moved]:
            del self._predicted[width]

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

    def _correction(self, width: int) -> float:
        """The width's own learned correction, else its nearest timed neighbours' (log-interpolated
        between the two around it), else the shared one (read once per prediction: seconds() keeps them)."""
        known = self._width_factors
        if width in known or not known:
            return known.get(width, self._factor)
        widths = self._factor_widths
        index = bisect.bisect_left(widths, width)
        lower = widths[index - 1] if index > 0 else None
        upper = widths[index] if index < len(widths) else None
        if lower is None or upper is None:
            return known[upper if lower is None else lower]
        share = (width - lower) / (upper - lower)
        return math.exp((1 - share) * math.log(known[lower]) + share * math.log(known[upper]))

    def optimistic_seconds(self, width: int, depth: int = 0) -> float:
        """What the controller chooses on: the prediction, less the optimism a little-timed group of widths earns."""
        seconds = self.seconds(width, depth)
        return seconds * self._optimism[_exploration_group(width)] if self._num_timed >= EXPLORE_AFTER_PASSES \
            else seconds

    def learned_curve(self, depth: int, widths=(1, 2, 4, 8, 16, 32)) -> dict | None:
        """The calibrated and the learned cost of some widths at one depth, and how often each was timed
        (what `pocketspec bench` reports beside each other); None without a calibrated table."""
        if self.measured is None:
            return None
        widths = [width for width in widths if width <= self.measured.max_width]
        return {"depth": depth, "widths": widths,
                "calibrated_seconds": [self.measured.forward_seconds(width, depth) for width in widths],
                "learned_seconds": [self.seconds(width, depth) for width in widths],
                "num_timed": [self.num_observed.get(width, 0) for width in widths]}

    def seconds(self, width: int, depth: int = 0) -> float:
        if width <= 0:
            return 0.0
        if self.measured is not None:
            by_depth = self._predicted.get(width)
            if by_depth is None:
                by_depth = self._predicted[width] = {}
            bucket = depth // DEPTH_BUCKET
            found = by_depth.get(bucket)
            if found is None:
                found = by_depth[bucket] = self._calibrated(width, depth) * self._correction(width)
            return found
        measured = self._seconds_by_width.get(width)
        if measured is not None:
            return measured
        scale = self._scale_sum / self._scale_count if self._scale_count else 0.08
        return scale * interpolate(self.prior_ratio, width)


def _exploration_group(width: int) -> int:
    return bisect.bisect_right(EXPLORATION_GROUPS, width) - 1
