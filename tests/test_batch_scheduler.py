"""The scheduler alone: which sequences of the pool step together."""

from __future__ import annotations

import pytest

from pocketspec.batch.scheduler import Candidate, pick


def _pool() -> list[Candidate]:
    # key, length, last step
    return [Candidate(0, 300, 4), Candidate(1, 40, 2), Candidate(2, 45, 3), Candidate(3, 290, 1), Candidate(4, 41, 4)]


def test_pad_takes_the_longest_waiting_sequences():
    assert pick(_pool(), max_batch=3, policy="pad", step=5) == [3, 1, 2]
    assert sorted(pick(_pool(), max_batch=8, policy="pad", step=5)) == [0, 1, 2, 3, 4]


def test_group_takes_the_largest_set_of_equal_lengths():
    # buckets of 64 positions: {40, 45, 41} and {300, 290}
    assert pick(_pool(), max_batch=8, policy="group", step=5, length_bucket=64) == [1, 2, 4]
    # both groups fill a batch of 2: the one that has waited longest goes
    assert pick(_pool(), max_batch=2, policy="group", step=5, length_bucket=64) == [3, 0]
    # exact lengths: every group has one sequence; the longest-waiting one goes
    assert pick(_pool(), max_batch=8, policy="group", step=5) == [3]


def test_group_lets_no_sequence_starve():
    assert pick(_pool(), max_batch=8, policy="group", step=20, length_bucket=64, max_wait=8) == [3, 0]


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown scheduler"):
        pick(_pool(), max_batch=2, policy="sorted", step=0)
