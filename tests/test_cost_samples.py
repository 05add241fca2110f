"""pocketspec.cost_samples: a cost per width from interleaved repeats, and whether the table can be trusted."""

from __future__ import annotations

import pytest

from pocketspec.cost_samples import (MAX_SPREAD, relative_spread, rising_per_row, robust_cost, summarize_depth,
                                     widths_to_measure_again)

# llama-bench on the 2-core EPYC, depth 512 (issue 38), in units of one row's cost
EPYC_CURVE = {1: 1.0, 2: 1.60, 4: 3.10, 8: 6.43, 16: 6.78}


def test_one_stray_slow_pass_moves_neither_the_cost_nor_the_spread():
    assert robust_cost([0.101, 0.180, 0.100]) == pytest.approx(0.100)
    assert relative_spread([0.101, 0.180, 0.100]) == pytest.approx(0.01)
    assert relative_spread([0.100, 0.120, 0.140]) > MAX_SPREAD  # repeats that disagree throughout
    assert relative_spread([0.100]) == 0.0


def test_a_real_curve_has_a_physical_shape_and_an_inflated_width_does_not():
    assert rising_per_row(EPYC_CURVE) == []
    assert rising_per_row({1: 0.029, 2: 0.053, 3: 0.069, 4: 0.084, 5: 0.102, 8: 0.134}) == []  # the Xeon (MODELS.md)
    assert rising_per_row({1: 0.029, 2: 0.053, 3: 0.069, 4: 0.060}) == []  # a kernel switch made 4 rows cheaper
    inflated = {**EPYC_CURVE, 8: 9.51}  # the calibrated table of issue 38: 1.19 a row at 8 against 0.78 at 4
    assert rising_per_row(inflated) == [8]


def test_widths_are_measured_again_where_repeats_disagree_or_the_cost_per_row_rises():
    samples = {1: [1.0, 1.0, 1.01], 2: [1.6, 1.6, 1.61], 4: [3.1, 3.9, 4.8], 8: [9.5, 9.5, 9.6], 16: [6.8, 6.8, 6.8]}
    assert widths_to_measure_again(samples) == [4, 8]


def test_a_depths_verdict_names_what_is_still_wrong():
    verdict = summarize_depth({1: [1.0, 1.0, 1.0], 2: [1.6, 2.4, 1.2], 8: [9.5, 9.5, 9.5]})
    assert verdict.seconds == {1: 1.0, 2: 1.2, 8: 9.5}
    assert verdict.disagreeing == (2,) and verdict.spread[2] == pytest.approx(0.4 / 1.2)
    assert verdict.rising == (8,)


def test_a_table_is_trusted_while_at_most_a_quarter_of_its_widths_disagree():
    from pocketspec.cost_samples import disagreeing_share, is_trusted

    quiet = {0: {width: 0.02 for width in range(1, 9)}, 512: {width: 0.02 for width in range(1, 9)}}
    assert disagreeing_share(quiet) == 0.0 and is_trusted(quiet)
    a_few_noisy = {**quiet, 0: {**quiet[0], 3: 0.15, 7: 0.3}}
    assert disagreeing_share(a_few_noisy) == pytest.approx(2 / 16) and is_trusted(a_few_noisy)
    busy = {**quiet, 512: {width: 0.2 for width in range(1, 9)}}
    assert not is_trusted(busy)
