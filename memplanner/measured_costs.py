"""This machine's forward costs: seconds for one pass of `width` tokens after `depth` cached tokens.

One table per model, backend build, thread count and weight layout, measured once by
pocketspec/calibrate.py and cached as JSON in POCKETSPEC_HOME/costs/. The planner and the
runtime's controller both read it; where no table exists they fall back to the reference
shapes of memplanner/costs.py.

Costs are steps, not lines (llama.cpp picks kernels by batch size: on the 2-core CPU a verify
of 8 rows costs about as much as one of 16), so every width is measured and widths are never
interpolated across a step; depths are interpolated linearly, since attention grows smoothly.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from memplanner.acceptance import expected_tokens_per_step


@dataclass(frozen=True)
class MeasuredCosts:
    key: str  # what the table is valid for: model file, backend build, threads, weight layout
    seconds: dict[int, dict[int, float]]  # depth -> width -> seconds
    weight_bytes: int = 0
    # depth -> width -> how far the timed repeats spread, as a share of the cost (pocketspec/cost_samples.py)
    spread: dict[int, dict[int, float]] = field(default_factory=dict)
    # a decode of several sequences goes in passes of at most this many tokens, each sequence's whole
    # (pocketspec/batch/llama_rows.py, to stay within the row-exact kernels); 0: one pass. Not stored.
    max_pass_tokens: int = 0

    @property
    def depths(self) -> list[int]:
        return sorted(self.seconds)

    @property
    def max_width(self) -> int:
        return min(max(row) for row in self.seconds.values())

    def _at_depth(self, depth_row: dict[int, float], width: int) -> float:
        if width in depth_row:
            return depth_row[width]
        widths = sorted(depth_row)
        if width > widths[-1]:  # past the table: the last measured cost per row
            return depth_row[widths[-1]] * width / widths[-1]
        return depth_row[widths[bisect.bisect_left(widths, width)]]  # the next measured width up

    def forward_seconds(self, width: int, depth: int = 0) -> float:
        if width <= 0:
            return 0.0
        depths = self.depths
        if depth <= depths[0]:
            return self._at_depth(self.seconds[depths[0]], width)
        if depth >= depths[-1]:
            if len(depths) == 1:
                return self._at_depth(self.seconds[depths[-1]], width)
            low, high = depths[-2], depths[-1]  # extend the last depth slope: attention keeps growing
        else:
            index = bisect.bisect_right(depths, depth)
            low, high = depths[index - 1], depths[index]
        low_cost = self._at_depth(self.seconds[low], width)
        high_cost = self._at_depth(self.seconds[high], width)
        return max(low_cost + (high_cost - low_cost) * (depth - low) / (high - low), low_cost)

    def efficient_widths(self, depth: int = 0, slack: float = 0.03) -> list[int]:
        """Widths no wider width matches in cost (within `slack`): the ends of the curve's flat steps."""
        widths = sorted(set().union(*(row.keys() for row in self.seconds.values())))
        efficient, cheapest_wider = [], float("inf")
        for width in reversed(widths):
            cost = self.forward_seconds(width, depth)
            if cost * (1.0 + slack) < cheapest_wider:
                efficient.append(width)
            cheapest_wider = min(cheapest_wider, cost)
        return sorted(efficient)

    def to_json(self) -> dict:
        def by_depth(table: dict[int, dict[int, float]]) -> dict:
            return {str(depth): {str(width): value for width, value in sorted(row.items())}
                    for depth, row in sorted(table.items())}
        return {"key": self.key, "weight_bytes": self.weight_bytes, "seconds": by_depth(self.seconds),
                "spread": by_depth(self.spread)}

    @classmethod
    def from_json(cls, data: dict) -> "MeasuredCosts":
        """The table to_json wrote; ValueError for one no measurement wrote (a spoilt or hand-edited file,
        whose zero, infinite or NaN costs would stop or mislead the controller and the planner)."""
        def by_depth(table: dict, check_value) -> dict[int, dict[int, float]]:
            return {parse_count(depth, 0): {parse_count(width, 1): check_value(value)
                                            for width, value in row.items()}
                    for depth, row in table.items()}
        seconds = by_depth(data["seconds"], measured_seconds)
        if not seconds or any(not row for row in seconds.values()):
            raise ValueError("a cost table needs at least one depth with one width")
        return cls(key=str(data["key"]), seconds=seconds, weight_bytes=parse_count(data.get("weight_bytes", 0), 0),
                   spread=by_depth(data.get("spread", {}), lambda value: finite_in_range(value, 0.0, math.inf)))

    def scaled(self, factor: float, key: str | None = None, weight_bytes: int | None = None) -> "MeasuredCosts":
        """The same curve, every cost times `factor` (a model of other size on the same kernels)."""
        seconds = {depth: {width: value * factor for width, value in row.items()} for depth, row in self.seconds.items()}
        return MeasuredCosts(key or self.key, seconds, self.weight_bytes if weight_bytes is None else weight_bytes,
                             self.spread)

    def for_rows(self, num_rows: int) -> "MeasuredCosts":
        """The costs of one decode of num_rows sequences, by each one's width (a batch's step): it carries
        num_rows x width tokens, each after about `depth` cached tokens of its own sequence, in passes of
        at most max_pass_tokens tokens."""
        if num_rows == 1:
            return self
        seconds = {depth: {width: self._passes(row, num_rows, width) for width in range(1, max(row) + 1)}
                   for depth, row in self.seconds.items()}
        return MeasuredCosts(f"{self.key} x {num_rows} rows", seconds, self.weight_bytes)

    def _passes(self, depth_row: dict[int, float], num_rows: int, width: int) -> float:
        rows_per_pass = max(1, self.max_pass_tokens // width) if self.max_pass_tokens else num_rows
        num_full, num_rest = divmod(num_rows, rows_per_pass)
        rest = self._at_depth(depth_row, num_rest * width) if num_rest else 0.0
        return num_full * self._at_depth(depth_row, rows_per_pass * width) + rest


# the seconds a measured forward may take: a table holding another value was not measured, and is measured again
MEASURED_SECONDS_RANGE = (1e-6, 3600.0)


def finite_in_range(value, low: float, high: float) -> float:
    """float(value), when it is a finite number from low to high; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ValueError(f"{value!r} is not a number from {low} to {high}")
    return float(value)


def measured_seconds(value) -> float:
    return finite_in_range(value, *MEASURED_SECONDS_RANGE)


def parse_count(text, low: int) -> int:
    """A table's width, depth or byte count (a JSON key is a string): an integer from `low`; else ValueError."""
    number = int(text)
    if number < low or str(number) != str(text).strip():
        raise ValueError(f"{text!r} is not an integer from {low}")
    return number


def load_measured_costs(path: Path) -> MeasuredCosts | None:
    """The cached table at `path`, or None when it is missing or unreadable (it is then re-measured); a FIFO or
    a device is not a table, and is not read (that would wait)."""
    try:
        if not path.is_file():
            return None
        return MeasuredCosts.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def best_draft_model_speedup(target: MeasuredCosts, draft: MeasuredCosts, alpha: float, max_gamma: int,
                             depth: int = 0) -> tuple[float, int]:
    """(predicted speed of the best γ over plain decoding, that γ) for a draft model accepted at α.

    A step drafts γ tokens (γ one-token draft passes) and verifies γ + 1 rows; it yields
    (1 − α^(γ+1)) / (1 − α) tokens. Below 1.0 the draft model cannot pay on these costs.
    """
    plain_rate = 1.0 / target.forward_seconds(1, depth)
    best = (0.0, 0)
    for gamma in range(1, max_gamma + 1):
        tokens = expected_tokens_per_step(alpha, gamma)
        seconds = gamma * draft.forward_seconds(1, depth) + target.forward_seconds(gamma + 1, depth)
        speedup = tokens / seconds / plain_rate
        if speedup > best[0]:
            best = (speedup, gamma)
    return best


@dataclass(frozen=True, eq=False)  # hashed by identity: the planner's candidate cache keys on it
class MachineCosts:
    """The calibrated tables of a plan's models, found by model shape, at a typical cached depth.

    memplanner.costs.forward_seconds takes it in place of the reference tables. A model with no
    table of its own (a draft never loaded here) gets the first table scaled by weight bytes:
    decoding streams the weights, so a model half the bytes runs on about half the time.
    """

    tables: tuple  # ((ModelShape, MeasuredCosts), ...)
    depth: int = 512

    def table_for(self, shape) -> MeasuredCosts | None:
        for known_shape, table in self.tables:
            if known_shape == shape:
                return table
        if not self.tables:
            return None
        known_shape, table = self.tables[0]
        return table.scaled(shape.weight_bytes / known_shape.weight_bytes, weight_bytes=shape.weight_bytes)

    def forward_seconds(self, shape, width: int) -> float | None:
        table = self.table_for(shape)
        return None if table is None else table.forward_seconds(width, self.depth)
