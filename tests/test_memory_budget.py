"""--memory-budget is parsed once, as the session's settings are made: bytes for the whole process, or bytes per
device of a split; bad text is one UserError before anything loads."""

from __future__ import annotations

import pytest

from memplanner.memory_budget import MemoryBudget, is_split, parse_memory_budget
from memplanner.split import DeviceBudget
from pocketspec.errors import UserError
from pocketspec.session_settings import SessionSettings

GIB = 2**30


@pytest.mark.parametrize("text, devices, expected", [
    ("3GiB", (), MemoryBudget(3 * GIB)),
    ("3.5G", ("cuda:1",), MemoryBudget(7 * GIB // 2)),
    ("6GiB", ("cuda:0", "cuda:1"), MemoryBudget(12 * GIB, (DeviceBudget("cuda:0", 6 * GIB),
                                                           DeviceBudget("cuda:1", 6 * GIB)))),
    ("6GiB,4GiB", ("cuda:0", "cuda:1"), MemoryBudget(10 * GIB, (DeviceBudget("cuda:0", 6 * GIB),
                                                                DeviceBudget("cuda:1", 4 * GIB)))),
    ("cpu:0=1GiB,cpu:1=2GiB", (), MemoryBudget(3 * GIB, (DeviceBudget("cpu:0", GIB),
                                                         DeviceBudget("cpu:1", 2 * GIB)))),
])
def test_a_budget_is_the_whole_process_or_one_per_device(text, devices, expected):
    budget = parse_memory_budget(text, devices)
    assert budget == expected
    assert is_split(devices, budget) == (len(devices) > 1 or bool(expected.per_device))


@pytest.mark.parametrize("text, devices, message", [
    ("lots", (), "--memory-budget 'lots'"),
    ("0", (), "must be positive"),
    ("0.4", (), r"fraction of a byte: give a unit, e\.g\. 0\.4GiB"),
    ("0.0001K", (), r"rounds to 0 bytes; write e\.g\. 512MiB"),
    ("6GiB,4GiB,2GiB", ("cuda:0", "cuda:1"), "2 devices"),
    ("cuda:0=6GiB,4GiB", (), "mixes"),
])
def test_a_bad_budget_says_what_is_wrong(text, devices, message):
    with pytest.raises(ValueError, match=message):
        parse_memory_budget(text, devices)


def test_the_settings_parse_the_budget_for_the_devices_they_name():
    settings = SessionSettings(memory_budget="2GiB", options={"devices": "cpu:0,cpu:1"})
    assert settings.budget.per_device == (DeviceBudget("cpu:0", 2 * GIB), DeviceBudget("cpu:1", 2 * GIB))
    assert SessionSettings().budget is None
    with pytest.raises(UserError, match="--memory-budget 'three gigs'"):
        SessionSettings(memory_budget="three gigs")
