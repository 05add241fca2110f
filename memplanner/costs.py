"""Step-cost model: seconds per forward pass by width, and the tokens/s a plan should reach.

The reference tables (CPU_REFERENCES) are llama.cpp CPU timings by batch width, measured on
a 2-core x86_64 CPU with llama-cpp-python 0.3.36 on 2026-11-21. Other models are scaled by weight bytes from the nearest reference,
since CPU decoding is bound by streaming the weights. Widths between table entries are
interpolated linearly; past the last entry the last slope is extended.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from memplanner.acceptance import expected_tokens_per_step
from memplanner.measured_costs import MachineCosts
from memplanner.defaults import ACCEPTANCE_PRIORS
from memplanner.shapes import ModelShape


@dataclass(frozen=True)
class ReferenceCost:
    name: str
    weight_bytes: int
    seconds_by_width: dict[int, float]


CPU_REFERENCES = (
    ReferenceCost("qwen2.5-coder-1.5b-instruct Q4_K_M", 1_111_370_240,
                  {1: 0.081, 2: 0.124, 3: 0.159, 5: 0.164, 9: 0.272, 17: 0.376}),
    ReferenceCost("qwen2.5-coder-0.5b-instruct Q5_0", 485_452_288,
                  {1: 0.042, 2: 0.047, 3: 0.057, 5: 0.081, 9: 0.130, 17: 0.184}),
)
# Without llama.cpp's repacked CPU weights a forward pass is slower in proportion to the
# share of weight bytes that would have been repacked: measured 2026-11-21 on the 1.5B target
# (56 % of its bytes repackable), one-token decoding took 1.25x as long unrepacked.
UNREPACKED_SLOWDOWN_PER_SHARE = 0.45
NGRAM_DRAFT_SECONDS = 0.0002  # one n-gram lookup in Python per drafted token: ~0 next to a forward pass


def interpolate(table: dict[int, float], width: int) -> float:
    """Linear in width between entries; the last slope beyond the last entry."""
    widths = sorted(table)
    if width <= widths[0]:
        return table[widths[0]]
    if width >= widths[-1]:
        last, before = widths[-1], widths[-2]
        return table[last] + (table[last] - table[before]) / (last - before) * (width - last)
    high = bisect.bisect_left(widths, width)
    low_width, high_width = widths[high - 1], widths[high]
    share = (width - low_width) / (high_width - low_width)
    return table[low_width] + share * (table[high_width] - table[low_width])


def nearest_reference(shape: ModelShape, references=CPU_REFERENCES) -> ReferenceCost:
    return min(references, key=lambda ref: abs(math.log(shape.weight_bytes / ref.weight_bytes)))


def forward_seconds(shape: ModelShape, width: int, references=CPU_REFERENCES, repacked: bool = True) -> float:
    """Seconds for one forward pass of `width` tokens: from this machine's calibrated table when
    `references` is a MachineCosts, else scaled from the nearest reference model (both timed with
    repacked weights)."""
    if isinstance(references, MachineCosts):
        seconds = references.forward_seconds(shape, width)
        references = CPU_REFERENCES
    else:
        seconds = None
    if seconds is None:
        reference = nearest_reference(shape, references)
        seconds = interpolate(reference.seconds_by_width, width) * shape.weight_bytes / reference.weight_bytes
    if not repacked and shape.weight_bytes:
        seconds *= 1.0 + UNREPACKED_SLOWDOWN_PER_SHARE * shape.repacked_bytes / shape.weight_bytes
    return seconds


def tokens_per_second(target: ModelShape, draft: ModelShape | None, drafter: str, gamma: int,
                      alpha: float | None = None, references=CPU_REFERENCES, repacked: bool = True) -> float:
    """Predicted decoding speed: E / (gamma * draft_cost_1 + target_cost(gamma + 1))."""
    target_step = forward_seconds(target, 1, references, repacked)
    if drafter == "none" or gamma == 0:
        return 1.0 / target_step
    if drafter == "model":
        if draft is None:
            raise ValueError("drafter 'model' needs a draft model shape")
        draft_step = forward_seconds(draft, 1, references, repacked)
    elif drafter == "ngram":
        draft_step = NGRAM_DRAFT_SECONDS
    else:
        raise ValueError(f"unknown drafter {drafter!r}: use model, ngram or none")
    alpha = ACCEPTANCE_PRIORS[drafter] if alpha is None else alpha
    step_seconds = gamma * draft_step + forward_seconds(target, gamma + 1, references, repacked)
    return expected_tokens_per_step(alpha, gamma) / step_seconds
