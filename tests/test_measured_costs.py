"""This machine's cost table: lookups by width and depth, efficient widths, and the draft-model verdict."""

import json
import os
from dataclasses import replace

import pytest

from memplanner.measured_costs import MeasuredCosts, best_draft_model_speedup, load_measured_costs
from pocketspec.measured_cache import read_json, write_json

# The 2-core CPU's shape (issue 13's llama-bench table): 5-8 rows cost what 16 do.
STEPPED = {1: 0.037, 2: 0.059, 3: 0.080, 4: 0.097, 5: 0.220, 6: 0.221, 7: 0.222, 8: 0.222,
           **{width: 0.226 for width in range(9, 17)}}


def _table(depth_rows=None) -> MeasuredCosts:
    return MeasuredCosts("test", depth_rows or {0: dict(STEPPED), 512: {w: s * 1.2 for w, s in STEPPED.items()}})


def test_depths_interpolate_and_widths_do_not():
    table = _table()
    assert table.forward_seconds(4, 0) == pytest.approx(0.097)
    assert table.forward_seconds(4, 256) == pytest.approx(0.097 * 1.1)
    assert table.forward_seconds(4, 1024) == pytest.approx(0.097 * 1.4)  # the last slope goes on


def test_a_width_between_measured_ones_costs_the_next_measured_width():
    table = MeasuredCosts("test", {0: {1: 0.01, 4: 0.03, 16: 0.05}})
    assert table.forward_seconds(2) == pytest.approx(0.03)
    assert table.forward_seconds(32) == pytest.approx(0.10)


def test_a_step_of_several_rows_costs_one_decode_of_all_their_tokens():
    table = _table()
    three_rows = table.for_rows(3)
    for depth in (0, 256, 512):
        assert three_rows.forward_seconds(2, depth) == pytest.approx(table.forward_seconds(6, depth))
        assert three_rows.forward_seconds(5, depth) == pytest.approx(table.forward_seconds(15, depth))
    # past the table, the last measured cost per token goes on: 3 x 8 = 24 tokens after 16 measured
    assert three_rows.forward_seconds(8) == pytest.approx(0.226 * 24 / 16)
    assert table.for_rows(1) is table


def test_a_step_wider_than_one_pass_costs_its_passes():
    """Passes of at most 16 tokens (llama.cpp's rows within the row-exact kernels), each row whole: 3 rows of
    5 tokens go in one pass of 15, 3 rows of 6 in passes of 12 and 6, 3 rows of 9 in three passes of 9."""
    table = replace(_table(), max_pass_tokens=16)
    three_rows = table.for_rows(3)
    assert three_rows.forward_seconds(5) == pytest.approx(table.forward_seconds(15))
    assert three_rows.forward_seconds(6) == pytest.approx(table.forward_seconds(12) + table.forward_seconds(6))
    assert three_rows.forward_seconds(9) == pytest.approx(3 * table.forward_seconds(9))


def test_efficient_widths_leave_out_the_flat_step():
    efficient = _table().efficient_widths(0)
    assert efficient[:4] == [1, 2, 3, 4]
    assert not set(range(5, 16)) & set(efficient)
    assert 16 in efficient


def test_round_trip_through_json(tmp_path):
    path = tmp_path / "costs" / "table.json"
    assert write_json(path, _table().to_json())
    assert load_measured_costs(path) == _table()


@pytest.mark.parametrize("text", ["", "{", "[]", json.dumps({"key": "k", "seconds": {}}),
                                  json.dumps({"key": "k", "seconds": {"0": {}}}),
                                  json.dumps({"key": "k", "seconds": {"x": {"1": 1}}}),
                                  # costs no machine measured: they stopped generate (a division by zero, a math
                                  # domain error) or gave plan a speed of 0 or 10^12 tok/s, named as measured
                                  *(json.dumps({"key": "k", "seconds": {"0": {"1": 0.01, "2": cost}}})
                                    for cost in (0, -0.01, 1e300, 1e-12, "0.01", None, True)),
                                  '{"key": "k", "seconds": {"0": {"1": NaN}}}',
                                  '{"key": "k", "seconds": {"0": {"1": Infinity}}}',
                                  json.dumps({"key": "k", "seconds": {"-1": {"1": 0.01}}}),
                                  json.dumps({"key": "k", "seconds": {"0": {"0": 0.01}}}),
                                  json.dumps({"key": "k", "seconds": {"0": {"1": 0.01}}, "spread": {"0": {"1": -1}}}),
                                  json.dumps({"key": "k", "seconds": {"0": {"1": 0.01}}, "weight_bytes": -5})])
def test_an_unreadable_table_is_measured_again_not_trusted(tmp_path, text):
    path = tmp_path / "table.json"
    path.write_text(text)
    assert load_measured_costs(path) is None


def test_a_fifo_is_not_read_as_a_table(tmp_path):
    """Reading one waits for a writer that never comes: generate hung before it measured."""
    path = tmp_path / "table.json"
    os.mkfifo(path)
    assert load_measured_costs(path) is None and read_json(path) is None


def test_a_draft_model_cannot_pay_when_verifying_two_rows_costs_almost_two_tokens():
    target = _table()
    draft = target.scaled(0.45)
    speedup, _ = best_draft_model_speedup(target, draft, alpha=0.8, max_gamma=8)
    assert speedup < 1.0


def test_a_draft_model_pays_when_verification_is_nearly_free():
    target = MeasuredCosts("gpu", {0: {width: 0.020 * (1 + 0.02 * (width - 1)) for width in range(1, 10)}})
    speedup, gamma = best_draft_model_speedup(target, target.scaled(0.2), alpha=0.8, max_gamma=8)
    assert speedup > 1.5 and gamma >= 3
