"""Seconds per forward pass by width and cached depth: this machine's calibrated table, refined online.

With a calibrated table (memplanner/measured_costs.py, measured by pocketspec/calibrate.py)
the prediction is the table's cost at that width and depth times two learned factors:

- the machine's speed now, shared by every width and learned from every pass (a process, or a spell
  of a busy machine, makes every width slower or faster together);
- the width's shape: how far its cost is off the table beside that speed, learned from its own
  passes, as the gap between each pass and the speed of the passes just before it. The speed is one
  row's (SPEED_WIDTH has no shape), and a pass moves it only by what its width's shape does not
  explain, so a width the table prices wrong does not move every other width. A width that was not
  timed often enough takes its nearest timed neighbours' shape (a table measured during a busy
  spell is off over a run of widths, not at one), else none.

Kept apart, a slow spell moves the speed, and so every width, at once. With one correction per
width, one-token passes (most of a run's) followed the spell while a rarely timed width kept the
cost of a faster time: in the Zen 3 EPYC's Spec-Bench run, a process whose one-row passes had
slowed to 52-68 ms priced two rows at 1.34-1.48x one row, where its own steps cost 1.52-1.64x. Its
controller then drafted single tokens that were accepted about half the time, and lost up to 14 % to
plain decoding on a prompt. Without a table, widths never
seen are predicted from a prior cost shape (relative to one token) scaled by what has been measured.

A table can condemn a width that is in truth cheap, and a controller that only trusts it would
never time that width and never learn. So the controller chooses on optimistic_seconds: a width
whose group of widths (EXPLORATION_GROUPS: neighbours share kernels and shapes) has n passes its
prediction learned from looks EXPLORATION / (1 + n) cheaper than predicted (optimism under
uncertainty), and is tried where it comes near the best choice; the optimism fades only as the
group's cost is learned (a width's passes count from its MIN_WIDTH_OBSERVATIONS-th, when its shape
is used), so the curve is learned in a bounded number of steps. On the recorded code edits
replayed against each CPU's table inflated 1.5x from 5 rows (benchmarks/replay_tables.py), 16
rows were learned to within 1 % in 200 steps; without the optimism they stayed 1.5x too dear. The optimism starts only after
EXPLORE_AFTER_PASSES timed passes: a process's first answer may be a dozen tokens (Spec-Bench's
extractions), and one exploring step in each group of widths then cost it 30 % of its speed.
What one run learned, its speed, its shapes and how far it explored, a later run adopts (learned(),
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


# The width whose cost the speed is (its shape is none): one-token passes, a run's most timed, so a slow
# spell they time is the speed's, not theirs alone
SPEED_WIDTH = 1
MIN_WIDTH_OBSERVATIONS = 3  # timed passes of one width before its own shape replaces its neighbours'
DEPTH_BUCKET = 32  # cached tokens over which one calibrated cost is used
# How much cheaper than predicted a width of a never-timed group looks to the controller: enough to
# try a width that a table measured on a busy machine made 1.5x too dear (issue 38)
EXPLORATION = 0.6
EXPLORE_AFTER_PASSES = 32  # timed passes before any width looks cheaper than predicted
EXPLORATION_GROUPS = (1, 2, 3, 4, 5, 9, 17)  # lower edges of the groups of widths explored together
# The most timed passes a later run adopts for one width or group (learned(), adopt()): what it adopts still
# moves with what it times, and a group it adopts still looks EXPLORATION / (1 + 16) cheaper once it explores
MAX_ADOPTED_PASSES = 16
MAX_ADOPTED_LOG_CORRECTION = 3.0  # a speed or shape past e^±3 (20x) is no correction but a broken file


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
        self._log_speed = 0.0  # log(observed / calibrated), smoothed over every pass: the machine's speed now
        self._speed = 1.0  # exp(_log_speed)
        self._calibrated_cache: dict[tuple[int, int], float] = {}
        # per width, once seen often enough: a table measured on a busy machine heals where it is used
        self._width_shapes: dict[int, tuple[int, float]] = {}  # width -> (timed passes, log shape)
        self._shape_factors: dict[int, float] = {}  # exp(shape) of the widths seen often enough
        self._shape_widths: list[int] = []  # those widths, ascending: a width's neighbours are a bisection away
        # each prediction before the speed, by width then depth bucket, until an observe moves a shape (the
        # controller asks for up to 64 widths a step, and a prediction takes a dozen lookups); an observe forgets
        # only the widths whose shape it moved (_moved_widths), and finds them among the widths, not among every
        # depth's entries
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
        if self.measured is not None:
            predicted = self._calibrated(width, depth)
            if predicted > 0:
                error = math.log(seconds / predicted)
                gap = error - self._log_speed  # this pass beside the speed of the passes before it
                count, shape = self._width_shapes.get(width, (0, gap))
                if width == SPEED_WIDTH:  # the speed is this width's: all that moves it is the machine's
                    shape = 0.0
                    self._log_speed += self.smoothing * gap
                else:
                    # the speed moves by what the width's shape does not explain (a width's first pass is all
                    # shape), so a width the table prices wrong does not move the speed of every other one
                    self._log_speed += self.smoothing * (gap - shape)
                    shape += self.smoothing * (gap - shape)
                self._speed = math.exp(self._log_speed)
                self._width_shapes[width] = (count + 1, shape)
                if count + 1 >= MIN_WIDTH_OBSERVATIONS:
                    self._fade_optimism(width)
                    if width not in self._shape_factors:
                        bisect.insort(self._shape_widths, width)
                        self._forget(None)
                    elif width != SPEED_WIDTH:
                        self._forget(self._moved_widths(width))
                    self._shape_factors[width] = math.exp(shape)
            return
        self._fade_optimism(width)  # without a table a width's first pass is its prediction
        self._forget(None)
        previous = self._seconds_by_width.get(width)
        if previous is None:
            self._seconds_by_width[width] = seconds
        else:
            self._seconds_by_width[width] = previous + self.smoothing * (seconds - previous)
        self._scale_sum += seconds / interpolate(self.prior_ratio, width)
        self._scale_count += 1

    def _fade_optimism(self, width: int) -> None:
        """A pass that the prediction learned from: its group of widths looks a little less cheaper than predicted.
        A width timed fewer than MIN_WIDTH_OBSERVATIONS times teaches its prediction nothing, so its passes fade
        nothing: with them counted, a table 1.5x too dear from 5 rows never healed on the Zen 3 EPYC's curve (each
        wide group timed twice, then priced 0.8x of the wrong cost and left)."""
        group = _exploration_group(width)
        self._num_observed_by_group[group] = self._num_observed_by_group.get(group, 0) + 1
        self._optimism[group] = 1.0 - EXPLORATION / (1 + self._num_observed_by_group[group])

    def learned(self) -> dict | None:
        """What the passes timed so far taught about the calibrated table, for a later run to adopt()
        (pocketspec/learned_costs.py keeps it); None without a calibrated table or a timed pass."""
        if self.measured is None or not self._width_shapes:
            return None
        return {"log_speed": self._log_speed,
                "shapes": {str(width): [min(count, MAX_ADOPTED_PASSES), shape]
                           for width, (count, shape) in sorted(self._width_shapes.items())},
                "groups": {str(EXPLORATION_GROUPS[group]): min(count, MAX_ADOPTED_PASSES)
                           for group, count in sorted(self._num_observed_by_group.items())}}

    def adopt(self, learned: dict) -> None:
        """Start from what an earlier run's learned() kept, as if this run had timed those passes: its speed and
        shapes beside the calibrated table, and its groups of widths explored (they look cheaper only by what is left of their
        optimism). ValueError, and nothing adopted, when `learned` is not what learned() makes."""
        try:
            log_speed = float(learned["log_speed"])
            shapes = {int(width): (int(count), float(shape)) for width, (count, shape) in learned["shapes"].items()}
            groups = {EXPLORATION_GROUPS.index(int(edge)): int(count) for edge, count in learned["groups"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"not a cost table's learned corrections: {error}") from None
        logs = [log_speed, *(shape for _, shape in shapes.values())]
        counts = [*(count for count, _ in shapes.values()), *groups.values()]
        if self.measured is None or not all(abs(value) <= MAX_ADOPTED_LOG_CORRECTION for value in logs) \
                or not all(1 <= count <= MAX_ADOPTED_PASSES for count in counts) or min(shapes, default=1) < 1:
            raise ValueError("not a cost table's learned corrections: a value out of range, or no calibrated table")
        self._log_speed, self._speed = log_speed, math.exp(log_speed)
        self._width_shapes = shapes
        self._shape_factors = {width: math.exp(shape) for width, (count, shape) in shapes.items()
                               if count >= MIN_WIDTH_OBSERVATIONS}
        self._shape_widths = sorted(self._shape_factors)
        self._num_observed_by_group = groups
        self._optimism = [1.0 - EXPLORATION / (1 + groups.get(group, 0)) for group in range(len(EXPLORATION_GROUPS))]
        self._forget(None)

    def _moved_widths(self, width: int) -> range:
        """The widths whose shape is `width`'s own (a timed width whose shape changed) or read from it:
        those between it and its timed neighbours, and every one past it where it is the last."""
        widths = self._shape_widths
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

    def _shape(self, width: int) -> float:
        """The width's own learned shape factor, else its nearest timed neighbours' (log-interpolated
        between the two around it), else 1 (read once per prediction: seconds() keeps them)."""
        known = self._shape_factors
        if width in known or not known:
            return known.get(width, 1.0)
        widths = self._shape_widths
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
                found = by_depth[bucket] = self._calibrated(width, depth) * self._shape(width)
            return found * self._speed
        measured = self._seconds_by_width.get(width)
        if measured is not None:
            return measured
        scale = self._scale_sum / self._scale_count if self._scale_count else 0.08
        return scale * interpolate(self.prior_ratio, width)


def _exploration_group(width: int) -> int:
    return bisect.bisect_right(EXPLORATION_GROUPS, width) - 1
