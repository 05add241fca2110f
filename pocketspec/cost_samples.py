"""From timed forward passes to one cost per width, and whether the table can be trusted (pure).

pocketspec/calibrate.py times every width in interleaved rounds: each round passes over all the
widths once, so a busy spell on a shared machine slows several widths once instead of one width
every time. Another process only ever makes a pass slower, never faster, so a width's cost is its
fastest pass, and its spread is how much slower its second-fastest pass was: two passes that agree
near the bottom are the machine's speed, one fast pass alone may be luck of the clock. Two checks
decide whether a width is measured again, and whether the table is cached:

- the repeats agree: spread at most MAX_SPREAD;
- the shape is physical: a wider batch reads each weight once for more rows, so the cost per row
  never rises with the width by more than SHAPE_TOLERANCE (kernel switches only make it fall).

A table is trusted when, after the extra rounds, at most MAX_DISAGREEING_SHARE of its widths
still disagree: a virtual machine's timer makes a few widths noisy on a quiet host too (the 2-core
EPYC: 2 to 4 of 24 past 10 %), while a second process measuring beside it made 9 to 13 of 24
disagree. An untrusted table is used for the run that measured it but not cached (measured again
next time). A shape that stays unphysical once its repeats agree is this machine's own, and is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

NUM_ROUNDS = 3  # every width timed once per round
MAX_EXTRA_ROUNDS = 3  # more rounds, for the widths whose repeats disagree or whose cost per row rises
MAX_SPREAD = 0.10  # the repeats of a width agree within this share of its cost
MAX_DISAGREEING_SHARE = 0.25  # a table is trusted while at most this share of its widths disagree
SHAPE_TOLERANCE = 0.15  # the cost per row may rise this much over a narrower width's (timing noise)


def robust_cost(samples: Sequence[float]) -> float:
    return min(samples)


def relative_spread(samples: Sequence[float]) -> float:
    """How much slower the second-fastest pass was than the fastest, as a share of it (0 for one pass):
    one slow stray pass does not move it, a machine whose speed keeps changing does."""
    if len(samples) < 2:
        return 0.0
    fastest, second = sorted(samples)[:2]
    return (second - fastest) / fastest if fastest > 0 else 0.0


def rising_per_row(costs: Mapping[int, float], tolerance: float = SHAPE_TOLERANCE) -> list[int]:
    """Widths whose cost per row exceeds a narrower width's by more than `tolerance`."""
    rising, cheapest_per_row = [], float("inf")
    for width in sorted(costs):
        per_row = costs[width] / width
        if per_row > cheapest_per_row * (1.0 + tolerance):
            rising.append(width)
        cheapest_per_row = min(cheapest_per_row, per_row)
    return rising


def widths_to_measure_again(samples: Mapping[int, Sequence[float]]) -> list[int]:
    """The widths whose repeats disagree or whose cost per row rises past the tolerance."""
    costs = {width: robust_cost(values) for width, values in samples.items()}
    disagreeing = {width for width, values in samples.items() if relative_spread(values) > MAX_SPREAD}
    return sorted(disagreeing | set(rising_per_row(costs)))


@dataclass(frozen=True)
class DepthCosts:
    """One depth's verdict: the cost and spread of each width, and what is still wrong with them."""

    seconds: dict[int, float]
    spread: dict[int, float]
    disagreeing: tuple[int, ...]  # widths whose repeats disagree past MAX_SPREAD: the table is not cached
    rising: tuple[int, ...]  # widths whose cost per row rises: kept (their repeats agree), and reported


def summarize_depth(samples: Mapping[int, Sequence[float]]) -> DepthCosts:
    seconds = {width: robust_cost(values) for width, values in sorted(samples.items())}
    spread = {width: relative_spread(values) for width, values in sorted(samples.items())}
    disagreeing = tuple(width for width, value in spread.items() if value > MAX_SPREAD)
    return DepthCosts(seconds, spread, disagreeing, tuple(rising_per_row(seconds)))


def disagreeing_share(spread: Mapping[int, Mapping[int, float]]) -> float:
    """The share of a table's (depth, width) costs whose repeats disagree past MAX_SPREAD."""
    values = [value for row in spread.values() for value in row.values()]
    return sum(value > MAX_SPREAD for value in values) / len(values) if values else 0.0


def is_trusted(spread: Mapping[int, Mapping[int, float]]) -> bool:
    return disagreeing_share(spread) <= MAX_DISAGREEING_SHARE
