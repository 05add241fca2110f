"""The device rules (pocketspec/torch_model/device_sampling.py) against the host rules they mirror:
the same distributions and greedy verdicts, and sampled verification that keeps the target
distribution (χ²)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from pocketspec.speculation.sampling import distribution, sample
from pocketspec.settings import SamplingSettings
from pocketspec.torch_model import device_sampling
from pocketspec.speculation.verify import verify_greedy

NUM_DRAWS = 20_000


@pytest.mark.parametrize("sampling", [SamplingSettings(temperature=1.0), SamplingSettings(temperature=0.7, top_k=5),
                                      SamplingSettings(temperature=1.3, top_p=0.8),
                                      SamplingSettings(temperature=0.9, top_k=40, top_p=0.5)])
def test_distributions_equal_the_host_rule(sampling):
    logits = np.random.default_rng(0).standard_normal((3, 500)).astype(np.float32) * 3
    on_device = device_sampling.distributions(torch.from_numpy(logits), sampling).numpy()
    for row in range(3):
        expected = distribution(logits[row], sampling)
        np.testing.assert_allclose(on_device[row], expected, atol=1e-6)
        assert np.array_equal(on_device[row] > 0, expected > 0)  # the same tokens kept


def test_draw_is_the_host_inverse_cdf_for_the_same_uniform():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(50))
    for uniform in rng.random(200):
        expected = sample(probs, _FixedUniform(uniform))
        assert int(device_sampling.draw(torch.from_numpy(probs), torch.tensor(uniform))) == expected


class _FixedUniform:
    def __init__(self, value: float):
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize("draft, choices", [([5, 7, 9], [5, 7, 3, 8]), ([1, 2], [1, 2, 6]), ([], [4]),
                                            ([3], [0, 3])])
def test_greedy_verdict_equals_the_host_rule(draft, choices):
    logits = torch.full((len(choices), 12), -1.0)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 2.0
    verdict = device_sampling.verify_greedy(torch.tensor(draft, dtype=torch.long), logits).tolist()
    expected = verify_greedy(draft, choices)
    assert verdict == [expected.num_accepted, expected.next_token]


def _first_emitted_counts(verify_one, vocab_size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(vocab_size)
    for _ in range(NUM_DRAWS):
        num_accepted, next_token, drafted = verify_one(rng)
        counts[drafted if num_accepted > 0 else next_token] += 1
    return counts


def _expected_counts(probs: torch.Tensor) -> np.ndarray:
    probs = probs.double().numpy()
    return probs / probs.sum() * NUM_DRAWS  # float32 rows sum to 1 only up to rounding


@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_verification_keeps_the_target_distribution(seed):
    vocab_size = 6
    rng = np.random.default_rng(seed + 10)
    target = torch.from_numpy(rng.dirichlet(np.ones(vocab_size), size=2)).float()  # p at the draft, then the bonus
    draft = torch.from_numpy(rng.dirichlet(np.ones(vocab_size))).float()  # q, deliberately different

    def verify_one(rng):
        drafted = int(rng.choice(vocab_size, p=draft.double().numpy() / draft.double().sum().item()))
        verdict = device_sampling.verify_sampled(torch.tensor([drafted]), draft[None], target,
                                                 torch.from_numpy(rng.random(2)).float()).tolist()
        return *verdict, drafted

    counts = _first_emitted_counts(verify_one, vocab_size, seed)
    assert chisquare(counts, _expected_counts(target[0])).pvalue > 1e-3


def test_point_mass_verification_keeps_the_target_distribution():
    vocab_size = 5
    target = torch.from_numpy(np.random.default_rng(3).dirichlet(np.ones(vocab_size), size=3)).float()

    def verify_one(rng):
        drafted = [2, 4]  # an n-gram's guess, whatever p says
        verdict = device_sampling.verify_point_mass(torch.tensor(drafted), target,
                                                    torch.from_numpy(rng.random(3)).float()).tolist()
        return *verdict, drafted[0]

    counts = _first_emitted_counts(verify_one, vocab_size, 4)
    assert chisquare(counts, _expected_counts(target[0])).pvalue > 1e-3


def test_a_wrong_residual_is_caught():
    """The χ² check above can fail: drawing the recovered token from p itself (not p - q) is biased."""
    vocab_size = 6
    rng = np.random.default_rng(5)
    target = torch.from_numpy(rng.dirichlet(np.ones(vocab_size), size=2)).float()
    draft = torch.from_numpy(rng.dirichlet(np.ones(vocab_size) * 0.3)).float()

    def verify_one(rng):
        drafted = int(rng.choice(vocab_size, p=draft.double().numpy() / draft.double().sum().item()))
        uniforms = torch.from_numpy(rng.random(2)).float()
        # a draft that claims q = p: every residual is empty and falls back to p
        verdict = device_sampling.verify_sampled(torch.tensor([drafted]), target[:1], target, uniforms).tolist()
        return *verdict, drafted

    counts = _first_emitted_counts(verify_one, vocab_size, 6)
    assert chisquare(counts, _expected_counts(target[0])).pvalue < 1e-6


def test_choose_is_the_argmax_or_a_draw_with_its_distribution():
    logits = torch.tensor([0.1, 3.0, -1.0, 2.9])
    token, probs = device_sampling.choose(logits, SamplingSettings(temperature=0.0), torch.tensor(0.5))
    assert int(token) == 1 and probs is None
    sampling = SamplingSettings(temperature=1.0)
    token, probs = device_sampling.choose(logits, sampling, torch.tensor(0.999))
    np.testing.assert_allclose(probs.numpy(), distribution(logits.numpy(), sampling), atol=1e-6)
    assert int(token) == 3  # the last token's share of the CDF
