"""pocketspec.stats: the peak-memory reading belongs to the process that reports it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pocketspec.stats import peak_rss_bytes

PARENT_BYTES = 400 * 2**20


def test_a_child_does_not_inherit_its_parents_peak():
    # ru_maxrss survives execve on Linux: a CLI spawned by a large process used to report
    # that process's high-water mark as its own (CI, 2026-11-22: 342 MB against a 228 MB plan)
    held = bytearray(PARENT_BYTES)
    held[::4096] = b"\x01" * len(held[::4096])
    assert peak_rss_bytes() >= PARENT_BYTES
    child = subprocess.run([sys.executable, "-c", "from pocketspec.stats import peak_rss_bytes; print(peak_rss_bytes())"],
                           capture_output=True, text=True, check=True)
    assert int(child.stdout) < PARENT_BYTES // 2
    del held


def test_the_peak_follows_what_this_process_touches():
    code = ("from pocketspec.stats import peak_rss_bytes\n"
            "before = peak_rss_bytes()\n"
            "held = bytearray(64 * 2**20)\n"
            "held[::4096] = bytes(len(held[::4096]))\n"
            "print(peak_rss_bytes() - before)")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(child.stdout) >= 60 * 2**20


def test_the_mean_draft_length_counts_only_the_steps_that_drafted():
    """What the chat's stats line shows: the last step's γ was 0 or 1 in most replies, whatever was drafted."""
    from pocketspec.stats import GenerationStats

    stats = GenerationStats()
    assert stats.mean_drafted_gamma == 0.0
    for num_drafted in (3, 0, 3, 0, 0, 1):
        stats.record_step("ngram" if num_drafted else "none", num_drafted, 0, 0.01)
    assert stats.mean_drafted_gamma == pytest.approx(7 / 3)
