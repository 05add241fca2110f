"""A session's learned cost corrections, kept for the next session (pocketspec/learned_costs.py, CostTable.learned
and adopt): a later run starts where the last one left off, and nothing it cannot trust is adopted."""

from __future__ import annotations

import json
import shutil

import pytest

from memplanner.measured_costs import MeasuredCosts
from pocketspec.learned_costs import adopt_learned_costs, keep_learned_costs, learned_costs_path
from pocketspec.session import open_session
from pocketspec.session_settings import SessionSettings
from pocketspec.speculation.costs import EXPLORATION, EXPLORE_AFTER_PASSES, MAX_ADOPTED_PASSES, CostTable
from tests.conftest import SESSION_HOME


def _measured(factor: float = 1.5, key: str = "test") -> MeasuredCosts:
    """A table that made every width from 5 on `factor` times too dear (issue 38's busy calibration)."""
    seconds = {width: 0.03 * (1 + 0.4 * (width - 1)) * (factor if width >= 5 else 1.0) for width in range(1, 33)}
    return MeasuredCosts(key, {0: seconds, 512: {width: 1.1 * cost for width, cost in seconds.items()}})


def _timed(table: CostTable, truth: MeasuredCosts, passes: int, widths=(1, 2, 4, 8, 16)) -> CostTable:
    for _ in range(passes):
        for width in widths:
            table.observe(width, truth.forward_seconds(width, 0), 0)
    return table


def test_a_table_that_adopts_what_another_learned_predicts_as_that_one_does():
    learned_in = _timed(CostTable(_measured()), _measured(factor=1.0), passes=5)
    later = CostTable(_measured())
    later.adopt(learned_in.learned())
    for depth in (0, 300, 512):
        assert [later.seconds(width, depth) for width in range(1, 33)] == \
            [learned_in.seconds(width, depth) for width in range(1, 33)]
    assert later.learned() == learned_in.learned()


def test_a_busy_calibration_healed_in_one_session_is_healed_from_the_next_ones_first_step():
    """Issue 38's target (16 rows within 15 % of the truth), met by the next process before it times a pass."""
    truth = _measured(factor=1.0)
    first = _timed(CostTable(_measured()), truth, passes=10)
    assert first.seconds(16) == pytest.approx(truth.forward_seconds(16), rel=0.15)
    fresh, next_session = CostTable(_measured()), CostTable(_measured())
    next_session.adopt(first.learned())
    assert fresh.seconds(16) == pytest.approx(1.5 * truth.forward_seconds(16))
    assert next_session.seconds(16) == pytest.approx(truth.forward_seconds(16), rel=0.15)


def test_an_adopted_group_explores_by_what_is_left_of_its_optimism():
    """A group timed more than MAX_ADOPTED_PASSES times is adopted as timed that often: a later run still tries it
    now and then (a correction kept from a busy spell can heal), and a group never timed is explored in full."""
    learned_in = _timed(CostTable(_measured()), _measured(factor=1.0), passes=40, widths=(1, 2, 16))
    later = CostTable(_measured())
    later.adopt(learned_in.learned())
    for _ in range(EXPLORE_AFTER_PASSES):  # the optimism waits for a run's own passes, adopted or not
        assert later.optimistic_seconds(16) == later.seconds(16)
        later.observe(1, later.seconds(1))
    assert later.optimistic_seconds(16) == pytest.approx(later.seconds(16) * (1 - EXPLORATION / (1 + MAX_ADOPTED_PASSES)))
    assert later.optimistic_seconds(6) == pytest.approx(later.seconds(6) * (1 - EXPLORATION))


@pytest.mark.parametrize("broken", [
    None, [], {}, {"log_speed": 0.0, "shapes": {}},
    {"log_speed": "x", "shapes": {}, "groups": {}},
    {"log_speed": 0.0, "shapes": {"4": [3]}, "groups": {}},
    {"log_speed": 0.0, "shapes": {}, "groups": {"6": 3}},  # not a group's edge
    {"log_speed": 9.0, "shapes": {}, "groups": {"1": 3}},  # a correction of e^9
    {"log_speed": 0.0, "shapes": {"4": [0, 0.1]}, "groups": {"4": 3}},
    {"log_speed": 0.0, "shapes": {"0": [3, 0.1]}, "groups": {"1": 3}},
    {"log_speed": 0.0, "shapes": {"4": [3, 0.1]}, "groups": {"4": 99}},
    # what a session kept before the speed and the shapes were apart (absolute corrections per width)
    {"log_correction": 0.0, "widths": {"2": [16, 0.1]}, "groups": {"1": 16, "2": 16}},
])
def test_what_learned_never_makes_is_refused_and_nothing_is_adopted(broken):
    table, fresh = CostTable(_measured()), CostTable(_measured())
    with pytest.raises(ValueError):
        table.adopt(broken)
    assert [table.seconds(width) for width in range(1, 33)] == [fresh.seconds(width) for width in range(1, 33)]
    assert table.learned() is None


def test_a_table_without_a_calibration_or_a_timed_pass_has_nothing_to_keep():
    assert CostTable(_measured()).learned() is None
    uncalibrated = CostTable()
    uncalibrated.observe(1, 0.03)
    assert uncalibrated.learned() is None
    with pytest.raises(ValueError):
        uncalibrated.adopt(_timed(CostTable(_measured()), _measured(1.0), passes=3).learned())


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    return tmp_path


def test_kept_in_the_home_and_adopted_by_a_session_on_the_same_table(home):
    learned_in = _timed(CostTable(_measured()), _measured(factor=1.0), passes=5)
    assert keep_learned_costs(learned_in)
    assert learned_costs_path(_measured()).parent == home / "costs"
    later = CostTable(_measured())
    assert adopt_learned_costs(later)
    assert later.seconds(16) == learned_in.seconds(16)


def test_a_table_measured_again_or_another_models_starts_afresh(home):
    assert keep_learned_costs(_timed(CostTable(_measured()), _measured(factor=1.0), passes=5))
    measured_again = CostTable(_measured(factor=1.2))  # same key, new numbers
    assert not adopt_learned_costs(measured_again)
    assert measured_again.seconds(16) == _measured(factor=1.2).forward_seconds(16)
    assert not adopt_learned_costs(CostTable(_measured(key="another model")))


def test_a_session_that_timed_nothing_keeps_nothing_and_leaves_what_was_kept(home):
    assert keep_learned_costs(_timed(CostTable(_measured()), _measured(factor=1.0), passes=5))
    kept = learned_costs_path(_measured()).read_text()
    adopted_only = CostTable(_measured())
    assert adopt_learned_costs(adopted_only)
    assert not keep_learned_costs(adopted_only)
    assert not keep_learned_costs(CostTable(_measured()))
    assert learned_costs_path(_measured()).read_text() == kept


@pytest.mark.parametrize("content", ["", "{", "[1, 2]", json.dumps({"table": "x", "learned": {}})])
def test_a_file_torn_or_edited_by_hand_costs_only_the_head_start(home, content):
    path = learned_costs_path(_measured())
    path.parent.mkdir(parents=True)
    path.write_text(content)
    table = CostTable(_measured())
    assert not adopt_learned_costs(table)
    assert table.learned() is None


def test_a_kept_file_for_this_table_whose_corrections_are_out_of_range_is_not_adopted(home):
    assert keep_learned_costs(_timed(CostTable(_measured()), _measured(factor=1.0), passes=5))
    path = learned_costs_path(_measured())
    kept = json.loads(path.read_text())
    kept["learned"]["log_speed"] = 40.0
    path.write_text(json.dumps(kept))
    table = CostTable(_measured())
    assert not adopt_learned_costs(table)
    assert table.learned() is None


def test_a_home_that_cannot_be_written_loses_only_the_head_start(home):
    (home / "costs").write_text("a file where the folder would be")
    assert not keep_learned_costs(_timed(CostTable(_measured()), _measured(factor=1.0), passes=5))
    assert not adopt_learned_costs(CostTable(_measured()))


@pytest.mark.real_model
def test_a_session_keeps_what_it_learned_and_the_next_one_starts_from_it(tmp_path, monkeypatch, smollm2_path):
    """On SmolLM2 with llama.cpp: the learned corrections outlive the session that timed them, the next session's
    table starts from them, and its output is the same (what is learned moves speed, never tokens)."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ("models", "exact_widths", "onnx"):  # measured and pulled once, shared; the cost tables copied
        (SESSION_HOME / name).mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(SESSION_HOME / name, target_is_directory=True)
    if (SESSION_HOME / "costs").is_dir():
        shutil.copytree(SESSION_HOME / "costs", home / "costs", ignore=shutil.ignore_patterns("*.lock", "*.learned.json"))
    monkeypatch.setenv("POCKETSPEC_HOME", str(home))
    settings = SessionSettings(target="smollm2-135m-instruct", draft="ngram", max_context=512, threads=1)
    prompt_text = "Count from 1 to 30, separated by commas."
    with open_session(settings) as session:
        table = session.engine.controller.target_costs
        assert table.measured is not None and table.learned() is None
        first = session.engine.generate(session.encode(prompt_text, chat=True), 48)
        learned = table.learned()
    assert learned is not None and learned_costs_path(table.measured).exists()
    with open_session(settings) as session:
        assert session.engine.controller.target_costs.learned() == learned
        assert session.engine.generate(session.encode(prompt_text, chat=True), 48).tokens == first.tokens
