"""The bench's two PNG plots, drawn with matplotlib's Agg backend (no display needed):
speedup over plain per category per system, and tok/s against peak memory."""

from __future__ import annotations

import math
from pathlib import Path

from apps.bench.figures import OVERALL, gpu_systems, speedups, summaries_by_category

SPEEDUP_PLOT = "speedup.png"
FRONTIER_PLOT = "frontier.png"
PLOTS = (SPEEDUP_PLOT, FRONTIER_PLOT)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def _save(figure, axes, path: Path, title: str, x_label: str | None, y_label: str) -> Path:
    if x_label:
        axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    axes.set_title(title)
    if axes.get_legend_handles_labels()[1]:  # nothing drawn (every system but plain failed): no empty legend
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    _pyplot().close(figure)
    return path


def plot_speedups(results: dict, path: Path) -> Path:
    pyplot = _pyplot()
    table = speedups(results)
    categories = list(table)
    systems = list(table[OVERALL])
    width = 0.8 / max(len(systems), 1)
    figure, axes = pyplot.subplots(figsize=(max(6.0, 1.0 + 0.9 * len(categories)), 4.5))
    for index, system in enumerate(systems):
        positions = [number + (index - (len(systems) - 1) / 2) * width for number in range(len(categories))]
        ratios = [table[category].get(system) for category in categories]  # None: no shared round, no bar
        axes.bar(positions, [math.nan if ratio is None else ratio for ratio in ratios], width, label=system)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    return _save(figure, axes, path, "Decode speed relative to plain decoding", None,
                 "speedup over plain decoding (×)")


def plot_frontier(results: dict, path: Path) -> Path:
    """One point per system and memory budget; a PocketSpec drafter's budgets are joined by a line."""
    pyplot = _pyplot()
    overall = summaries_by_category(results)[OVERALL]
    series: dict[str, list[tuple[float, float, str]]] = {}
    for system in results["systems"]:
        summary = overall.get(system["name"])
        if summary is None:
            continue
        budget = system.get("budget_bytes")
        point = (summary["peak_memory_bytes"] / 2**30, summary["tokens_per_second"],
                 f"{budget / 2**30:.2f} GiB budget" if budget else "")
        series.setdefault(system.get("family", system["name"]), []).append(point)
    figure, axes = pyplot.subplots(figsize=(6.5, 4.5))
    for family, points in series.items():
        points.sort()
        axes.plot([point[0] for point in points], [point[1] for point in points], marker="o", label=family)
        for memory, rate, label in points:
            if label:
                axes.annotate(label, (memory, rate), fontsize="x-small", textcoords="offset points", xytext=(4, 4))
    memory = "peak memory (GiB; torch's GPU allocator peak where a GPU ran)" if gpu_systems(results) else \
        "peak resident memory (GiB)"
    return _save(figure, axes, path, "Speed against memory", memory,
                 "decode tok/s (all prompts)")


def write_plots(results: dict, out_dir: Path) -> list[Path]:
    return [plot_speedups(results, out_dir / SPEEDUP_PLOT), plot_frontier(results, out_dir / FRONTIER_PLOT)]
