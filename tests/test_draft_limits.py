"""Draft-length limits: what the settings ask for, narrowed to what the target verifies, in one type that the
engine's controller, the session's logits rows and the planner's workload all read."""

from __future__ import annotations

import pytest

from conftest import built_engine
from pocketspec.speculation.draft_limits import DraftLimits, batch_speculation, requested_draft_limits
from pocketspec.settings import MAX_DRAFTLESS_GAMMA, MAX_GAMMA, SpeculationSettings
from tiny_models import write_tiny_pair


@pytest.mark.parametrize("options, drafts, expected", [
    ({}, True, DraftLimits(MAX_GAMMA, MAX_DRAFTLESS_GAMMA)),
    ({"drafter": "ngram"}, True, DraftLimits(MAX_GAMMA, MAX_DRAFTLESS_GAMMA)),
    ({"drafter": "model", "max_gamma": 5}, True, DraftLimits(5, 5)),
    ({"gamma": 3}, True, DraftLimits(3, 3, 3)),
    ({"drafter": "none", "gamma": 3}, True, DraftLimits(0, 0)),
    ({}, False, DraftLimits(0, 0)),
])
def test_the_settings_ask_for_one_set_of_limits(options, drafts, expected):
    limits = requested_draft_limits(SpeculationSettings(**options), drafts)
    assert limits == expected
    assert limits.verify_width == max(expected.model, expected.draftless) + 1


def test_a_batch_sizes_its_verifies_for_a_fixed_gamma_wider_than_max_gamma():
    assert batch_speculation(SpeculationSettings(gamma=12, max_gamma=4)).max_gamma == 12
    assert batch_speculation(SpeculationSettings(gamma=2, max_gamma=4)).max_gamma == 2
    assert batch_speculation(SpeculationSettings(max_gamma=4)).max_gamma == 4


def test_a_narrower_target_lowers_every_limit_and_a_fixed_gamma_with_them():
    assert DraftLimits(8, 31).within(15) == DraftLimits(8, 15)
    assert DraftLimits(12, 12, 12).within(3) == DraftLimits(3, 3, 3)
    assert DraftLimits(8, 31).within(-1) == DraftLimits(0, 0)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    target, _ = write_tiny_pair(tmp_path_factory.mktemp("tiny_limits"), quant=None, num_layers=2)
    return target


@pytest.mark.parametrize("gamma", [None, 6, 12])
def test_the_engine_drafts_within_the_rows_its_target_verifies(tiny_target, gamma):
    """The session asks the target for the requested verify width (the torch backend allows fewer rows); the
    engine's controller reads the limits narrowed to the rows it got, and says when a fixed --gamma was lowered."""
    with built_engine(tiny_target, backend="torch", weights="fp32", drafter="ngram", gamma=gamma,
                      max_context=256) as engine:
        requested = requested_draft_limits(SpeculationSettings(drafter="ngram", gamma=gamma))
        rows = engine.target.max_logits_rows
        assert 1 < rows <= requested.verify_width
        assert engine.limits == requested.within(rows - 1)
        controller = engine.controller
        assert (controller.max_gamma, controller.max_draftless_gamma, controller.fixed_gamma) == (
            engine.limits.model, engine.limits.draftless, engine.limits.fixed)
        is_lowered = gamma is not None and gamma > rows - 1
        assert any(f"--gamma {gamma} lowered to {rows - 1}" in note for note in engine.notes) == is_lowered
