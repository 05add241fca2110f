"""Reading llama-bench's JSON output, captured from a real run (SmolLM2, tg16, 2 threads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.bench.peers.llama_bench import parse_rate, reference_note


def test_rate_from_captured_json():
    rate, deviation = parse_rate((Path(__file__).parent / "data" / "llama_bench.json").read_text())
    assert rate == pytest.approx(12.733212) and deviation == pytest.approx(5.361594)


def test_missing_tool_is_a_note_not_an_error(tmp_path):
    note = reference_note(tmp_path, Path("target.gguf"), num_tokens=16, num_threads=2)
    assert note.startswith("llama-bench not found in")
