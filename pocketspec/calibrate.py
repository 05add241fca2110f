"""Measure a loaded backend's forward costs by width and cached depth, once, and cache them.

The table (memplanner/measured_costs.py) is keyed by what decides the cost: the model file,
the backend and its build, the thread count, the weight layout and the device. It lives in
POCKETSPEC_HOME/costs/; `pocketspec doctor --calibrate` measures it again on request.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from memplanner.measured_costs import MeasuredCosts, load_measured_costs, save_measured_costs
from pocketspec.catalog import pocketspec_home

CALIBRATION_DEPTHS = (0, 1024)  # cached tokens before the measured forward; clipped to the context
MAX_CALIBRATED_WIDTH = 32
# Every width up to 16 (llama.cpp's kernel steps sit there), then every fourth: a width between
# two measured ones is costed as the wider (memplanner/measured_costs.py), never underestimated.
CALIBRATED_WIDTHS = (*range(1, 17), 20, 24, 28, 32)
NUM_REPEATS = 2  # the fastest of these is kept: a busy neighbour only ever makes a pass slower


def _build_identity(settings) -> dict:
    if settings.backend == "torch":
        import torch

        return {"backend": "torch", "torch": torch.__version__, "device": settings.device,
                "devices": list(settings.devices), "weights": settings.weights, "compile": settings.compile,
                "decode_step": settings.decode_step}
    import llama_cpp

    return {"backend": "llama.cpp", "llama_cpp": llama_cpp.__version__,
            "system": llama_cpp.llama_print_system_info().decode(errors="replace"),
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
    return pocketspec_home() / "costs" / f"{hashlib.sha1(key.encode()).hexdigest()[:20]}.json"


def _filler_tokens(count: int, vocab_size: int) -> list[int]:
    """Ordinary token ids spread over the vocabulary: a forward's cost does not depend on which."""
    span = max(vocab_size - 1024, 1)
    return [256 + (index * 7919) % span for index in range(count)]


def _time_forward(backend, depth: int, width: int, all_rows: bool, filler: list[int]) -> float:
    best = float("inf")
    rows = range(width) if all_rows else [width - 1]
    for _ in range(NUM_REPEATS):
        backend.rollback(depth)
        started = time.perf_counter()
        backend.forward(filler[depth:depth + width], rows)
        best = min(best, time.perf_counter() - started)
    return best


def measure_costs(backend, *, max_width: int | None = None, depths=CALIBRATION_DEPTHS) -> MeasuredCosts:
    """Time one forward of every width up to max_width at each depth. Leaves the cache empty.

    all_rows: a verify asks for every row's logits; a draft model (one logits row) for the last only.
    """
    all_rows = backend.max_logits_rows > 1
    widest = min(max_width or MAX_CALIBRATED_WIDTH, backend.max_logits_rows if all_rows else MAX_CALIBRATED_WIDTH,
                 getattr(backend, "n_batch", MAX_CALIBRATED_WIDTH), MAX_CALIBRATED_WIDTH)
    usable_depths = sorted({min(depth, backend.max_context - widest - 1) for depth in depths if depth >= 0})
    filler = _filler_tokens(usable_depths[-1] + widest, backend.vocab_size)
    backend.rollback(0)
    seconds: dict[int, dict[int, float]] = {}
    try:
        for depth in usable_depths:
            if depth > backend.num_cached:
                backend.rollback(backend.num_cached)
                backend.prefill(filler[backend.num_cached:depth + 1])
                backend.rollback(depth)
            _time_forward(backend, depth, 1, all_rows, filler)  # warm the kernels at this depth
            seconds[depth] = {width: _time_forward(backend, depth, width, all_rows, filler)
                              for width in sorted({*(w for w in CALIBRATED_WIDTHS if w < widest), widest})}
    finally:
        backend.rollback(0)
    return MeasuredCosts(cost_key(backend.model_path, backend.settings), seconds, weight_bytes=_weight_bytes(backend))


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


def calibrated_costs(backend, *, min_width: int = 1, on_measure=None, force: bool = False) -> MeasuredCosts:
    """The cached table, or a new measurement (then cached; a home that cannot be written only loses the cache).

    on_measure(message): called before a measurement starts, so a front end can say why it waits.
    """
    costs = None if force else cached_costs(backend.model_path, backend.settings, min_width)
    if costs is not None:
        return costs
    if on_measure is not None:
        on_measure(f"measuring {Path(backend.model_path).name}'s forward costs on this machine "
                   "(once; cached in POCKETSPEC_HOME/costs)")
    costs = measure_costs(backend, max_width=max(min_width, MAX_CALIBRATED_WIDTH))
    try:
        save_measured_costs(costs, cost_table_path(costs.key))
    except OSError:
        pass
    return costs


def calibrate_models(target_path: Path, draft_path: Path | None, target_settings, on_measure=None) -> list[MeasuredCosts]:
    """Measure the target (and a draft model) again, as `pocketspec doctor --calibrate` asks; returns the tables."""
    from dataclasses import replace

    from pocketspec.backends.torch_open import open_backend
    from pocketspec.loader import draft_settings_for

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
    """One line per depth: the cost of a few widths and the widths worth verifying."""
    lines = []
    for depth in costs.depths:
        shown = ", ".join(f"{width}: {1000 * costs.forward_seconds(width, depth):.0f}"
                          for width in (1, 2, 4, 8, 16, 32) if width <= costs.max_width)
        efficient = ",".join(map(str, costs.efficient_widths(depth)))
        lines.append(f"  depth {depth:5}: ms by width {{{shown}}}; efficient widths {efficient}")
    return lines


def machine_costs(target_path: Path, draft_path: Path | None, target_settings, draft_settings=None):
    """The planner's view of this machine: the cached tables of the target (and draft) under these
    settings as a MachineCosts, or None when the target was never measured (the planner then uses
    its reference tables)."""
    from memplanner.measured_costs import MachineCosts
    from memplanner.shapes import shape_from_gguf

    target_costs = cached_costs(target_path, target_settings)
    if target_costs is None:
        return None
    tables = [(shape_from_gguf(target_path), target_costs)]
    if draft_path is not None:
        draft_costs = cached_costs(draft_path, draft_settings or target_settings)
        if draft_costs is not None:
            tables.append((shape_from_gguf(draft_path), draft_costs))
    return MachineCosts(tuple(tables))
