"""Seconds of one batched forward, split as MagicDec splits them, and the speedup a self-sparse draft gives.

A forward of B rows, each adding w tokens after S cached tokens of its own, costs
- what its new tokens cost with nothing cached: the weights streamed once and the matmuls of B × w
  tokens (token_seconds, by B × w);
- what each row pays to read its own cached keys and values, B × S of them in all (kv_seconds, by
  B × S: at long contexts and large batches this term dominates);
- attention's compute over them for a row's further queries: the kv term times kv_width_factor[w]
  (a verify's queries share each key's load, but a CPU computes them; the batch-invariant kernels do it
  a tile of queries at a time, so the factor rises in steps).

A self-sparse draft is the same model over a window of sinks and recent tokens: the same terms with
S fixed at the window (fixed_context), so its cost stays flat in context while the target's grows.
predicted_speedup puts the two together with the acceptance α; crossover_context is the context
from which speculation pays at a batch size.

Costs come from this machine (pocketspec/batch/step_calibration.py times a few forwards, and
POCKETSPEC_HOME/costs keeps them) or, before that, from a roofline of the model's bytes and FLOPs on
a reference device (reference_step_costs).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace

from memplanner.acceptance import expected_tokens_per_step
from memplanner.costs import interpolate
from memplanner.measured_costs import (MEASURED_SECONDS_RANGE, MeasuredCosts, finite_in_range, measured_seconds,
                                      parse_count)
from memplanner.shapes import ModelShape
from memplanner.torch_sizes import torch_kv_bytes, torch_weight_bytes

# The roofline before anything is measured: a 2-core laptop-class CPU, and the H200 the GPU suite measured
# (docs/gpu.md: 4254 GB/s copy bandwidth). Only their ratios to the model's bytes and FLOPs matter to a speedup.
REFERENCE_DEVICES = {"cpu": (20e9, 100e9), "gpu": (4.25e12, 400e12)}  # (bytes/s, FLOP/s)
ROOFLINE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXT_GRID = tuple(256 * step for step in range(1, 129))  # contexts crossover_context tries, up to 32k


@dataclass(frozen=True)
class StepCosts:
    key: str  # what the costs are valid for (model, weights, kernels, threads, device)
    token_seconds: dict[int, float]  # new tokens in one forward (rows × width) -> seconds with nothing cached
    kv_seconds: dict[int, float]  # cached tokens summed over the rows -> seconds for one query each to attend
    kv_width_factor: dict[int, float] = field(default_factory=lambda: {1: 1.0})  # width -> kv term × this
    fixed_context: int | None = None  # a sliding draft's window: every row attends over this many tokens
    is_measured: bool = False  # timed on this machine, else the reference roofline

    def forward_seconds(self, num_rows: int, width: int, context: int) -> float:
        """One forward of num_rows rows, each adding `width` tokens after `context` cached tokens."""
        if num_rows <= 0 or width <= 0:
            return 0.0
        if self.fixed_context is not None:  # a window fills in its first steps and then stays full
            context = self.fixed_context
        return (interpolate(self.token_seconds, num_rows * width)
                + interpolate(self.kv_seconds, num_rows * context) * self.width_factor(width))

    def width_factor(self, width: int) -> float:
        """The kv term's factor at this width: the next measured width's (steps are never interpolated
        across), past the widest the widest's per query."""
        widths = sorted(self.kv_width_factor)
        if width > widths[-1]:
            return self.kv_width_factor[widths[-1]] * width / widths[-1]
        return self.kv_width_factor[widths[bisect.bisect_left(widths, width)]]

    def with_window(self, window: int) -> StepCosts:
        """The same model drafting over a window of `window` positions per row (self-sparse)."""
        return replace(self, fixed_context=window, key=f"{self.key}, window {window}")

    def for_rows(self, num_rows: int, max_width: int = 33, max_context: int = 32768) -> MeasuredCosts:
        """A forward of num_rows rows as the controller's cost table reads it (by one row's width and
        depth): the depths where the kv term bends, so its linear depth interpolation is this model's."""
        if self.fixed_context is not None:
            depths = [0]
        else:
            bends = {point // num_rows for point in self.kv_seconds if 0 < point // num_rows < max_context}
            depths = sorted({0, max_context, *bends})
        seconds = {depth: {width: self.forward_seconds(num_rows, width, depth) for width in range(1, max_width + 1)}
                   for depth in depths}
        return MeasuredCosts(f"{self.key} x {num_rows} rows", seconds)

    def to_json(self) -> dict:
        return {"key": self.key, "token_seconds": {str(k): v for k, v in sorted(self.token_seconds.items())},
                "kv_seconds": {str(k): v for k, v in sorted(self.kv_seconds.items())},
                "kv_width_factor": {str(k): v for k, v in sorted(self.kv_width_factor.items())},
                "is_measured": self.is_measured}

    @classmethod
    def from_json(cls, data: dict) -> StepCosts:
        """The costs to_json wrote; ValueError for costs no measurement wrote (MeasuredCosts.from_json)."""
        def table(name: str, low_key: int, check_value) -> dict[int, float]:
            found = {parse_count(key, low_key): check_value(value) for key, value in data[name].items()}
            if not found:
                raise ValueError(f"a batch cost table needs its {name}")
            return found
        return cls(str(data["key"]), table("token_seconds", 1, measured_seconds),
                   table("kv_seconds", 0, lambda value: finite_in_range(value, 0.0, MEASURED_SECONDS_RANGE[1])),
                   table("kv_width_factor", 1, lambda value: finite_in_range(value, 1.0, math.inf)),
                   is_measured=bool(data["is_measured"]))


def reference_step_costs(key: str, *, weight_bytes: int, kv_bytes_per_token: int, num_params: int, num_layers: int,
                         num_heads: int, head_dim: int, on_gpu: bool) -> StepCosts:
    """The roofline of a forward on the reference device: weights and cached keys and values streamed at its
    bandwidth, 2 FLOPs a parameter a token and 4 a head dimension a cached token a query (scores and the
    weighted sum) at its FLOP rate, each term bound by the slower of the two."""
    bandwidth, flop_rate = REFERENCE_DEVICES["gpu" if on_gpu else "cpu"]
    tokens = {count: max(weight_bytes / bandwidth, 2 * count * num_params / flop_rate) for count in ROOFLINE_TOKENS}
    attention_flops = 4 * num_layers * num_heads * head_dim

    def per_cached(width: int) -> float:
        return max(kv_bytes_per_token / bandwidth, width * attention_flops / flop_rate)

    kv = {0: 0.0, 1 << 20: (1 << 20) * per_cached(1)}
    return StepCosts(key, tokens, kv, {width: per_cached(width) / per_cached(1) for width in ROOFLINE_TOKENS})


def shape_step_costs(shape: ModelShape, *, weights_format: str, kv_dtype: str, is_tied: bool, on_gpu: bool,
                     num_layers: int | None = None) -> StepCosts:
    """reference_step_costs of a torch model of this shape (num_layers: a self-skip draft's first layers)."""
    share = (num_layers or shape.num_layers) / shape.num_layers
    fp32_bytes = torch_weight_bytes(shape, "fp32", is_tied=is_tied)
    return reference_step_costs(
        f"{shape.name} {weights_format} roofline", on_gpu=on_gpu, num_layers=num_layers or shape.num_layers,
        weight_bytes=int(share * torch_weight_bytes(shape, weights_format, is_tied=is_tied, on_gpu=on_gpu)),
        kv_bytes_per_token=torch_kv_bytes(shape, kv_dtype, 1, num_layers=num_layers),
        num_params=int(share * fp32_bytes) // 4, num_heads=shape.num_heads, head_dim=shape.head_dim)


@dataclass(frozen=True)
class SpeedupPrediction:
    context: int
    plain_tokens_per_second: float  # all rows together
    speculative_tokens_per_second: float
    gamma: int  # the draft length that gives it

    @property
    def speedup(self) -> float:
        return self.speculative_tokens_per_second / self.plain_tokens_per_second


def predicted_speedup(target: StepCosts, draft: StepCosts, *, num_rows: int, context: int, alpha: float,
                      max_gamma: int) -> SpeedupPrediction:
    """Plain decoding against the best γ of drafting γ tokens for every row (a first pass that catches up
    one token besides, then γ − 1 single ones) and verifying γ + 1 per row, each row's drafts accepted at α."""
    plain_seconds = target.forward_seconds(num_rows, 1, context)
    best_rate, best_gamma = num_rows / plain_seconds, 0
    for gamma in range(1, max_gamma + 1):
        seconds = (draft.forward_seconds(num_rows, 2, context) + (gamma - 1) * draft.forward_seconds(num_rows, 1, context)
                   + target.forward_seconds(num_rows, gamma + 1, context))
        rate = num_rows * expected_tokens_per_step(alpha, gamma) / seconds
        if rate > best_rate:
            best_rate, best_gamma = rate, gamma
    return SpeedupPrediction(context, num_rows / plain_seconds, best_rate, best_gamma)


def crossover_context(target: StepCosts, draft: StepCosts, *, num_rows: int, alpha: float, max_gamma: int,
                      max_context: int) -> int | None:
    """The shortest context (on CONTEXT_GRID, up to max_context) from which speculation beats plain decoding
    at this batch size; None where it does not within max_context."""
    for context in (*(point for point in CONTEXT_GRID if point < max_context), max_context):
        if predicted_speedup(target, draft, num_rows=num_rows, context=context, alpha=alpha,
                             max_gamma=max_gamma).gamma > 0:
            return context
    return None
