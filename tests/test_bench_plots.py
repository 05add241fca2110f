"""The bench's plots are written as non-empty PNG files from a small fake results file."""

from __future__ import annotations

import json
from pathlib import Path

from apps.bench.plots import FRONTIER_PLOT, SPEEDUP_PLOT, write_plots

RESULTS_PATH = Path(__file__).parent / "data" / "bench_results_small.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plots_are_png_files(tmp_path):
    paths = write_plots(json.loads(RESULTS_PATH.read_text()), tmp_path)
    assert [path.name for path in paths] == [SPEEDUP_PLOT, FRONTIER_PLOT]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 10_000  # axes, bars and labels, not an empty canvas
