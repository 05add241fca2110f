"""Seeded draws (pocketspec/speculation/draws.py): each position's draw follows its distribution exactly,
positions are independent, and a draft drawing from its own q with the same draws agrees with the target
as often as the exponential race promises."""

import numpy as np
import pytest
from scipy.stats import chisquare

from pocketspec.speculation.draws import TAIL_BELOW, SeededDraws, position_key, race, unit_interval

NUM_DRAWS = 30_000


def _counts(draws: SeededDraws, probs: np.ndarray, num_draws: int = NUM_DRAWS) -> np.ndarray:
    counts = np.zeros(probs.shape[-1])
    for ahead in range(num_draws):
        counts[draws.token(probs, ahead)] += 1
    return counts


@pytest.mark.parametrize("seed", [0, 7])
def test_draws_over_positions_follow_the_distribution(seed):
    probs = np.random.default_rng(seed).dirichlet(np.ones(8))
    counts = _counts(SeededDraws(seed), probs)
    assert chisquare(counts, probs * NUM_DRAWS).pvalue > 1e-3


def test_the_tail_group_is_drawn_with_its_mass_and_within_it_by_probability():
    """10 % of the mass in 20,000 tokens below TAIL_BELOW: the group wins 10 % of the draws, and inside it
    a token twice as likely as another is drawn twice as often."""
    tail = np.full(20_000, TAIL_BELOW / 4)
    tail[:10_000] *= 2  # the first half twice as likely
    tail *= 0.1 / tail.sum()
    probs = np.concatenate([[0.5, 0.4], tail])
    counts = _counts(SeededDraws(3), probs)
    grouped = np.array([counts[0], counts[1], counts[2:10_002].sum(), counts[10_002:].sum()])
    expected = np.array([0.5, 0.4, 0.1 * 2 / 3, 0.1 / 3]) * NUM_DRAWS
    assert chisquare(grouped, expected).pvalue > 1e-3


def test_the_check_has_power():
    """A race that ignores the tail group (draws only among likely tokens) fails the same check."""
    probs = np.concatenate([[0.6, 0.3], np.full(20_000, 0.1 / 20_000)])
    head_only = probs.copy()
    head_only[2:] = 0
    counts = _counts(SeededDraws(3), head_only)
    grouped = np.array([counts[0], counts[1], counts[2:].sum()])
    assert chisquare(grouped + 1e-9, np.array([0.6, 0.3, 0.1]) * NUM_DRAWS).pvalue < 1e-6


def test_a_draw_is_a_function_of_seed_position_and_distribution():
    probs = np.random.default_rng(1).dirichlet(np.ones(50) * 0.5)
    draws = SeededDraws.after(42, [9] * 5)
    assert [draws.token(probs, ahead) for ahead in range(20)] == [SeededDraws(42, 5 + i).token(probs) for i in range(20)]
    assert draws.ahead(3).token(probs) == draws.token(probs, 3)
    assert [SeededDraws(43).token(probs, i) for i in range(20)] != [SeededDraws(42).token(probs, i) for i in range(20)]
    assert position_key(42, 5) != position_key(42, 6) != position_key(43, 5)


def test_unnormalised_weights_draw_as_their_distribution():
    """The same tokens, as no token here is near TAIL_BELOW (scaling moves a token across it)."""
    probs = np.random.default_rng(2).dirichlet(np.ones(30))
    keys = [position_key(9, position) for position in range(200)]
    assert [race(probs, key) for key in keys] == [race(probs * 3.0, key) for key in keys]


def _tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


@pytest.mark.parametrize("concentration", [0.3, 1.0])
def test_a_draft_drawing_with_the_same_draws_agrees_as_the_race_promises(concentration):
    """P(draft's draw == target's draw) >= (1 - TV) / (1 + TV), and never beats 1 - TV (the best coupling)."""
    rng = np.random.default_rng(5)
    agreement, lower, upper = [], [], []
    for position in range(400):
        p = rng.dirichlet(np.ones(40) * concentration)
        q = 0.6 * p + 0.4 * rng.dirichlet(np.ones(40) * concentration)
        draws = SeededDraws(11, position * 100)
        agreement.append(np.mean([draws.token(p, i) == draws.token(q, i) for i in range(100)]))
        tv = _tv(p, q)
        lower.append((1 - tv) / (1 + tv))
        upper.append(1 - tv)
    assert np.mean(lower) - 0.01 <= np.mean(agreement) <= np.mean(upper) + 0.01


def test_a_distribution_with_every_token_under_the_threshold_draws_from_the_tail_alone():
    """Temperature 100 over a 150k vocabulary leaves no token at TAIL_BELOW: the tail group always wins and
    its inverse CDF picks by probability (ten bins of a ramp)."""
    probs = np.linspace(1.0, 3.0, 200_000)
    probs /= probs.sum()
    assert probs.max() < TAIL_BELOW
    counts = np.zeros(10)
    draws = SeededDraws(4)
    for ahead in range(5000):
        counts[draws.token(probs, ahead) // 20_000] += 1
    expected = probs.reshape(10, -1).sum(axis=1) * 5000
    assert chisquare(counts, expected).pvalue > 1e-3


def test_the_extreme_bits_stay_inside_the_open_unit_interval():
    """All ones would give u = 1.0 with 53 bits and a half (a race time of 0: that token would always win)."""
    extremes = np.array([0, 2**64 - 1, 2**63, 2**12 - 1], dtype=np.uint64)
    values = unit_interval(extremes)
    assert np.all(values > 0) and np.all(values < 1)
    assert values[1] == (2**52 - 0.5) / 2**52
