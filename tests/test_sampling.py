"""Temperature, top-k and top-p shape target and draft distributions identically."""

import numpy as np

from pocketspec.speculation.draws import SeededDraws
from pocketspec.speculation.sampling import choose_token, distribution
from pocketspec.settings import SamplingSettings


def test_temperature_one_is_softmax():
    logits = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    expected = np.exp(logits) / np.exp(logits).sum()
    assert np.allclose(distribution(logits, SamplingSettings(temperature=1.0)), expected)


def test_top_k_keeps_only_k_best():
    logits = np.array([0.0, 5.0, 1.0, 4.0])
    probs = distribution(logits, SamplingSettings(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(probs)) == {1, 3}
    assert np.isclose(probs.sum(), 1.0)


def test_top_p_keeps_smallest_prefix_reaching_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = distribution(logits, SamplingSettings(temperature=1.0, top_p=0.75))
    assert set(np.flatnonzero(probs)) == {0, 1}
    assert np.allclose(probs[[0, 1]], [0.5 / 0.8, 0.3 / 0.8])


def test_top_p_over_a_large_vocabulary_falls_back_to_full_sort():
    logits = np.zeros(5000)  # flat: the best 1024 hold only ~20 % of the mass
    probs = distribution(logits, SamplingSettings(temperature=1.0, top_p=0.5))
    assert 2400 <= np.count_nonzero(probs) <= 2600


def test_choose_token_is_the_argmax_or_the_draw_for_its_position():
    logits = np.array([0.5, 2.0, 1.0])
    draws = SeededDraws(4, position=3)
    assert choose_token(logits, SamplingSettings(), draws) == 1
    sampling = SamplingSettings(temperature=1.0)
    assert choose_token(logits, sampling, draws) == SeededDraws(4).token(distribution(logits, sampling), ahead=3)
