"""Measure a loaded backend's forward costs by width and cached depth, once, and cache them.

The table (memplanner/measured_costs.py) is keyed by what decides the cost: the model file,
the backend and its build, the thread count, the weight layout and the device. It lives in
POCKETSPEC_HOME/costs/; `pocketspec doctor --calibrate` measures it again on request. Widths are
timed in interleaved rounds and each kept as its fastest pass, with its spread (pocketspec/cost_samples.py);
a table whose repeats disagree is used once and not cached, until a machine busy at every start has
measured it so MAX_UNTRUSTED_RUNS times in a row (pocketspec/untrusted_runs.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from memplanner.measured_costs import MachineCosts, MeasuredCosts, load_measured_costs
from memplanner.shapes import shape_from_gguf
from pocketspec.backends.torch_open import open_backend
from pocketspec.cost_samples import (MAX_EXTRA_ROUNDS, MAX_SPREAD, NUM_ROUNDS, disagreeing_share, is_trusted,
                                     summarize_depth, widths_to_measure_again)
from pocketspec.measured_cache import costs_dir, measuring_alone, write_json
from pocketspec.settings import draft_settings_for
from pocketspec.untrusted_runs import forget_untrusted_runs, count_untrusted_run, untrusted_ending

CALIBRATION_DEPTHS = (0, 1024)  # cached tokens before the measured forward; clipped to the context
MAX_CALIBRATED_WIDTH = 32
# Every width up to 16 (llama.cpp's kernel steps sit there), then every fourth: a width between
# two measured ones is costed as the wider (memplanner/measured_costs.py), never underestimated.
CALIBRATED_WIDTHS = (*range(1, 17), 20, 24, 28, 32)


def _build_identity(settings) -> dict:
    if settings.backend == "torch":
        import torch

        return {"backend": "torch", "torch": torch.__version__, "device": settings.device,
                "devices": list(settings.devices), "weights": settings.weights, "compile": settings.compiles,
                "decode_step": "static" if settings.uses_static_step else "dynamic"}
    if settings.backend == "onnx":
        import onnxruntime

        return {"backend": "onnx", "onnxruntime": onnxruntime.__version__, "ep": settings.execution_provider,
                "weights": settings.weights, "prepack": settings.prepack_weights}
    import llama_cpp

    from pocketspec.backends.ggml_ops import cpu_library_identity, row_exact_max_rows

    # the row-exact kernels (native/patches/row-exact-verify.patch), and each version of them, change
    # what a verify of 2-32 rows costs
    return {"backend": "llama.cpp", "llama_cpp": llama_cpp.__version__,
            "system": llama_cpp.llama_print_system_info().decode(errors="replace"), "row_exact": row_exact_max_rows(),
            "cpu_kernels": cpu_library_identity(),
            "repack": settings.repack_weights, "gpu_layers": settings.gpu_layers, "kv_type": settings.kv_type,
            "devices": list(settings.devices)}


def cost_key(model_path: Path, settings) -> str:
    """A stable description of everything a model's forward cost depends on (settings: ModelSettings)."""
    path = Path(model_path)
    stat = path.stat()
    identity = {"model": path.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                "threads": settings.resolved_num_threads, **_build_identity(settings)}
    return json.dumps(identity, sort_keys=True)


def cost_table_path(key: str) -> Path:
    return costs_dir() / f"{hashlib.sha1(key.encode()).hexdigest()[:20]}.json"


def _filler_tokens(count: int, vocab_size: int) -> list[int]:
    """Ordinary token ids spread over the vocabulary: a forward's cost does not depend on which."""
    span = max(vocab_size - 1024, 1)
    return [256 + (index * 7919) % span for index in range(count)]


@dataclass(frozen=True)
class _Timing:
    """What every timed forward of one measurement shares."""

    backend: object
    all_rows: bool  # a verify asks for every row's logits; a draft model (one logits row) for the last only
    filler: list[int]
    clock: Callable[[], float]

    def once(self, depth: int, width: int) -> float:
        self.backend.rollback(depth)
        rows = range(width) if self.all_rows else [width - 1]
        started = self.clock()
        self.backend.forward(self.filler[depth:depth + width], rows)
        return self.clock() - started

    def rounds(self, depth: int, widths: list[int], num_rounds: int, samples: dict[int, list[float]]) -> None:
        """num_rounds passes over `widths`, one forward each, alternately narrow to wide and back: a
        drift of the machine's speed during a round falls on every width alike."""
        for _ in range(num_rounds):
            for width in widths:
                samples[width].append(self.once(depth, width))
            widths = widths[::-1]

    def depth_costs(self, depth: int, widths: list[int]):
        self.once(depth, 1)  # warm the kernels at this depth
        samples: dict[int, list[float]] = {width: [] for width in widths}
        self.rounds(depth, widths, NUM_ROUNDS, samples)
        for _ in range(MAX_EXTRA_ROUNDS):
            again = widths_to_measure_again(samples)
            if not again:
                break
            self.rounds(depth, again, 1, samples)
        return summarize_depth(samples)


def measure_costs(backend, *, max_width: int | None = None, depths=CALIBRATION_DEPTHS,
                  clock: Callable[[], float] = time.perf_counter) -> MeasuredCosts:
    """Time every width up to max_width at each depth, in interleaved rounds. Leaves the cache empty."""
    all_rows = backend.max_logits_rows > 1
    widest = min(max_width or MAX_CALIBRATED_WIDTH, backend.max_logits_rows if all_rows else MAX_CALIBRATED_WIDTH,
                 getattr(backend, "n_batch", MAX_CALIBRATED_WIDTH), MAX_CALIBRATED_WIDTH)
    widths = sorted({*(width for width in CALIBRATED_WIDTHS if width < widest), widest})
    usable_depths = sorted({min(depth, backend.max_context - widest - 1) for depth in depths if depth >= 0})
    timing = _Timing(backend, all_rows, _filler_tokens(usable_depths[-1] + widest, backend.vocab_size), clock)
    backend.rollback(0)
    by_depth = {}
    try:
        for depth in usable_depths:
            if depth > backend.num_cached:
                backend.rollback(backend.num_cached)
                backend.prefill(timing.filler[backend.num_cached:depth + 1])
                backend.rollback(depth)
            by_depth[depth] = timing.depth_costs(depth, widths)
    finally:
        backend.rollback(0)
    return MeasuredCosts(cost_key(backend.model_path, backend.settings),
                         {depth: costs.seconds for depth, costs in by_depth.items()},
                         weight_bytes=_weight_bytes(backend),
                         spread={depth: costs.spread for depth, costs in by_depth.items()})


def _weight_bytes(backend) -> int:
    try:
        return int(backend.memory_report().get("weights", 0))
    except (AttributeError, TypeError, ValueError):
        return 0


def cached_costs(model_path: Path, settings, min_width: int = 1) -> MeasuredCosts | None:
    """The cached table of this model under these settings when it covers widths up to min_width."""
    key = cost_key(model_path, settings)
    costs = load_measured_costs(cost_table_path(key))
    if costs is None or costs.key != key or costs.max_width < min_width:
        return None
    return costs


def calibrated_costs(backend, *, min_width: int = 1, on_measure=None, force: bool = False,
                     clock: Callable[[], float] = time.perf_counter) -> MeasuredCosts:
    """The cached table, or a new measurement: cached when its repeats agree (a home that cannot be
    written only loses the cache), else used for this run only and measured again next time.

    Measured under the home's measuring lock: a process that waited for another one's measurement
    of the same table reads it instead. on_measure(message): told before a measurement starts, so
    a front end can say why it waits, and after one that is not cached.
    """
    costs = None if force else cached_costs(backend.model_path, backend.settings, min_width)
    if costs is not None:
        return costs
    with measuring_alone():
        costs = None if force else cached_costs(backend.model_path, backend.settings, min_width)
        if costs is not None:
            return costs
        if on_measure is not None:
            when = "as asked" if force else "once"
            on_measure(f"measuring {Path(backend.model_path).name}'s forward costs on this machine "
                       f"({when}; cached in POCKETSPEC_HOME/costs)")
        costs = measure_costs(backend, max_width=max(min_width, MAX_CALIBRATED_WIDTH), clock=clock)
        path = cost_table_path(costs.key)
        is_trusted_table = is_trusted(costs.spread)
        is_cached = is_trusted_table or count_untrusted_run(path)
        if not is_trusted_table and on_measure is not None:
            on_measure(f"{Path(backend.model_path).name}'s forward costs varied by more than {MAX_SPREAD:.0%} "
                       f"between repeats at {disagreeing_share(costs.spread):.0%} of the widths"
                       f"{untrusted_ending(is_cached)}")
        if is_cached:
            forget_untrusted_runs(path)
            if not write_json(path, costs.to_json()) and on_measure is not None:
                on_measure(f"could not save {Path(backend.model_path).name}'s forward costs to {path} (is "
                           "POCKETSPEC_HOME writable?); this run uses them, the next one measures them again")
    return costs


def calibrate_models(target_path: Path, draft_path: Path | None, target_settings, on_measure=None) -> list[MeasuredCosts]:
    """Measure the target (and a draft model) again, as `pocketspec doctor --calibrate` asks; returns the tables."""
    target_settings = replace(target_settings, max_logits_rows=MAX_CALIBRATED_WIDTH)
    jobs = [(target_path, target_settings)]
    if draft_path is not None:
        jobs.append((draft_path, draft_settings_for(target_settings)))
    tables = []
    for path, settings in jobs:
        with open_backend(path, settings) as backend:
            tables.append(calibrated_costs(backend, min_width=MAX_CALIBRATED_WIDTH, on_measure=on_measure, force=True))
    return tables


def describe_costs(costs: MeasuredCosts) -> list[str]:
    """One line per depth: the cost of a few widths with their spread, and the widths worth verifying."""
    lines = []
    for depth in costs.depths:
        spread = costs.spread.get(depth, {})
        shown = ", ".join(f"{width}: {1000 * costs.forward_seconds(width, depth):.0f}"
                          + (f" ±{spread[width]:.0%}" if width in spread else "")
                          for width in (1, 2, 4, 8, 16, 32) if width <= costs.max_width)
        efficient = ",".join(map(str, costs.efficient_widths(depth)))
        lines.append(f"  depth {depth:5}: ms by width {{{shown}}}; efficient widths {efficient}")
    return lines


def machine_costs(target_path: Path, draft_path: Path | None, target_settings, draft_settings=None):
    """The planner's view of this machine: the cached tables of the target (and draft) under these
    settings as a MachineCosts, or None when the target was never measured (the planner then uses
    its reference tables)."""
    target_costs = cached_costs(target_path, target_settings)
    if target_costs is None:
        return None
    tables = [(shape_from_gguf(target_path), target_costs)]
    if draft_path is not None:
        draft_costs = cached_costs(draft_path, draft_settings or target_settings)
        if draft_costs is not None:
            tables.append((shape_from_gguf(draft_path), draft_costs))
    return MachineCosts(tuple(tables))
