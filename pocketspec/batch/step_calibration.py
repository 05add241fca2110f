"""Time a batch's forwards on this machine into StepCosts (memplanner/batch_step_costs.py), and cache them.

A forward's cost does not depend on what its cache holds, only on how much: rows are filled for
timing by length alone (BatchedModel.hold_for_timing), so a point at 16 rows × 8k cached tokens
costs one forward, not a prefill of 128k tokens. What is timed, in interleaved rounds (the
fastest pass of each point kept, pocketspec/cost_samples.py):
- new tokens with nothing cached, from 1 to every row's widest verify;
- one token per row after a quarter of the context and after the whole of it, at one row and at
  every row (the kv term, by the cached tokens summed over the rows);
- every row's wider queries after the whole context (attention's cost by query width).
Points whose repeats disagree are timed again, up to MAX_EXTRA_ROUNDS more times.
Tables are cached in POCKETSPEC_HOME/costs when their repeats agree, keyed by the model, its
settings and the batch's shape (pocketspec/batch/step_costs.py).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from memplanner.batch_step_costs import StepCosts
from pocketspec.batch.batched_model import BatchedModel
from pocketspec.batch.step_costs import batch_models, step_costs_key, store_step_costs
from pocketspec.batch_session import open_batch_session
from pocketspec.cost_samples import (MAX_EXTRA_ROUNDS, MAX_SPREAD, NUM_ROUNDS, disagreeing_share, is_trusted,
                                     relative_spread, robust_cost)
from pocketspec.errors import UserError
from pocketspec.measured_cache import measuring_alone
from pocketspec.session_settings import settings_for
from pocketspec.speculation.draft_limits import batch_speculation

Point = tuple[int, int, int]  # (rows, width, cached tokens per row)
# widths whose attention is timed: a batch-invariant kernel's query tiles of 4 step at 5, 9, 17, 33
FACTOR_WIDTHS = (2, 4, 5, 8, 9, 16, 17, 32, 33)


def _points(model: BatchedModel, max_rows: int) -> tuple[list[Point], list[Point], list[Point]]:
    """Points of new tokens alone, of cached tokens at one query a row, and of wider queries over a context."""
    rows = min(max_rows, model.num_rows)
    width = min(model.max_logits_rows, model.max_context - 1)
    longest = model.max_context - width
    token_points, count = [], 1
    while count < rows * width:
        token_points.append((min(count, rows), max(1, count // rows), 0))
        count *= 2
    token_points.append((rows, width, 0))
    kv_points = sorted({(num_rows, 1, context) for num_rows in (1, rows) for context in (longest // 4, longest)
                        if context > 0})
    factor_points = [(rows, factor_width, longest)
                     for factor_width in sorted({*(w for w in FACTOR_WIDTHS if w < width), width}) if factor_width > 1]
    return token_points, kv_points, factor_points


def _time_once(model: BatchedModel, point: Point, clock: Callable[[], float]) -> float:
    num_rows, width, context = point
    rows = list(range(num_rows))
    for row in rows:
        model.hold_for_timing(row, context)
    started = clock()
    model.forward(rows, [[0] * width for _ in rows], [width] * num_rows)
    return clock() - started


def measure_step_costs(model: BatchedModel, key: str, *, max_rows: int, num_rounds: int = NUM_ROUNDS,
                       clock: Callable[[], float] = time.perf_counter) -> tuple[StepCosts, dict[int, float]]:
    """(the costs, each timed point's spread between repeats) of forwards of up to max_rows rows; leaves every
    row empty."""
    token_points, kv_points, factor_points = _points(model, max_rows)
    points = [*token_points, *kv_points, *factor_points]
    samples: dict[Point, list[float]] = {point: [] for point in points}
    try:
        _time_once(model, points[0], clock)  # warm the kernels
        for round_index in range(num_rounds):
            for point in points if round_index % 2 == 0 else points[::-1]:
                samples[point].append(_time_once(model, point, clock))
        for _ in range(MAX_EXTRA_ROUNDS):  # the points whose repeats disagree, again
            for point in [point for point in points if relative_spread(samples[point]) > MAX_SPREAD]:
                samples[point].append(_time_once(model, point, clock))
    finally:
        for row in range(model.num_rows):
            model.rollback(row, 0)
    seconds = {point: robust_cost(values) for point, values in samples.items()}
    tokens = {rows * width: seconds[(rows, width, 0)] for rows, width, _ in token_points}
    if len(tokens) < 2:  # one row of one token: the roofline's flat start
        tokens[2] = tokens[1]
    kv = {0: 0.0}
    for rows, width, context in kv_points:
        kv[rows * context] = max(0.0, seconds[(rows, width, context)] - tokens[rows])
    costs = StepCosts(key, tokens, kv, is_measured=True)
    factors = {1: 1.0}
    for rows, width, context in factor_points:
        one_query = costs.forward_seconds(rows, 1, context) - costs.forward_seconds(rows, 1, 0)
        wide = seconds[(rows, width, context)] - costs.forward_seconds(rows, width, 0)
        factors[width] = max(factors[max(factors)], wide / one_query) if one_query > 0 else factors[max(factors)]
    costs = replace(costs, kv_width_factor=factors)
    return costs, {index: relative_spread(samples[point]) for index, point in enumerate(points)}


def measure_and_store(model: BatchedModel, key: str, *, max_rows: int,
                      on_measure: Callable[[str], None] | None = None,
                      clock: Callable[[], float] = time.perf_counter) -> StepCosts:
    """A new measurement under the home's measuring lock, cached when its repeats agree (else used once, and
    on_measure is told)."""
    with measuring_alone():
        if on_measure is not None:
            on_measure("measuring the batch's forward costs on this machine (cached in POCKETSPEC_HOME/costs)")
        costs, spread = measure_step_costs(model, key, max_rows=max_rows, clock=clock)
    if is_trusted({0: spread}):
        if not store_step_costs(costs) and on_measure is not None:
            on_measure("could not save the batch's forward costs in POCKETSPEC_HOME/costs (is it writable?); this "
                       "run uses them, the next one measures them again")
    elif on_measure is not None:
        on_measure(f"{disagreeing_share({0: spread}):.0%} of the batch's timed forwards varied by more than "
                   f"{MAX_SPREAD:.0%} between repeats (is the machine busy?); they are not cached: measure again "
                   "on a quieter machine")
    return costs


def calibrate_batch(settings, batch, on_measure: Callable[[str], None] | None = None) -> list[tuple[str, StepCosts]]:
    """Measure again, as `pocketspec doctor --calibrate --batch N` asks, the forward costs of a torch batch of
    these settings (SessionSettings, BatchSettings): its target's, and its draft model's (self-sparse: over its
    window; self-skip: its layers). Returns (role, costs) pairs."""
    choice, target_settings, speculation = settings_for(settings)
    if target_settings.backend != "torch":
        raise UserError("--calibrate --batch measures the torch backend's batch pool; add --backend torch")
    priced = batch_models(choice, target_settings, batch_speculation(speculation), batch)
    with open_batch_session(settings, batch) as session:
        engine = session.engine
        opened = [engine.target] + ([engine.draft.draft] if engine.draft is not None else [])
        return [(model.role, measure_and_store(batched, step_costs_key(model.path, target_settings, model.shape),
                                               max_rows=model.shape.num_rows, on_measure=on_measure))
                for model, batched in zip(priced, opened)]


def describe_step_costs(costs: StepCosts, num_rows: int, contexts: list[int]) -> list[str]:
    """A few forwards' costs: one token per row, and a verify of every row's widest, by context."""
    widest = max(costs.kv_width_factor)
    lines = []
    for rows in sorted({1, num_rows}):
        shown = ", ".join(f"{context}: {1000 * costs.forward_seconds(rows, 1, context):.0f}/"
                          f"{1000 * costs.forward_seconds(rows, widest, context):.0f}" for context in contexts)
        lines.append(f"  {rows} rows: ms of 1/{widest} tokens a row by cached tokens a row {{{shown}}}")
    factors = ", ".join(f"{width}: {factor:.2f}" for width, factor in sorted(costs.kv_width_factor.items()))
    lines.append(f"  attention's cost by query width (x one query) {{{factors}}}")
    return lines
