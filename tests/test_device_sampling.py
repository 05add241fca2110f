"""The device rules (pocketspec/torch_model/device_sampling.py) against the host rules they mirror:
the same distributions, uniforms, draws and verdicts, and sampled verification that keeps the target
distribution (χ²)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from pocketspec.speculation.draws import SeededDraws, uniforms, unit_interval
from pocketspec.speculation.sampling import distribution
from pocketspec.settings import SamplingSettings
from pocketspec.torch_model import device_sampling
from pocketspec.speculation.verify import verify_greedy, verify_logits

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


def test_the_device_hash_gives_the_host_uniforms_bit_for_bit():
    keys = SeededDraws(123, 7).keys(3)
    ids = np.arange(5000)
    on_device = device_sampling.uniforms(torch.from_numpy(keys), torch.from_numpy(ids)).numpy()
    assert np.array_equal(on_device, np.stack([uniforms(int(key), ids) for key in keys.view(np.uint64)]))


def test_the_device_maps_the_extreme_bits_as_the_host_does():
    extremes = np.array([0, 2**64 - 1, 2**63, 2**12 - 1], dtype=np.uint64)
    on_device = device_sampling.unit_interval(torch.from_numpy(extremes.view(np.int64))).numpy()
    assert np.array_equal(on_device, unit_interval(extremes))


def test_race_rows_draw_the_host_token_for_the_same_position():
    """Rows with a tail group (tokens under TAIL_BELOW) and without: the same tokens as the host's race."""
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(3000) * 0.02, size=64)
    probs[::2] = 0.9 * probs[::2] + 0.1 / 3000  # every other row: 10 % spread thin over the vocabulary
    keys = SeededDraws(9).keys(64)
    on_device = device_sampling.race_rows(torch.from_numpy(probs), torch.from_numpy(keys)).tolist()
    assert on_device == [SeededDraws(9).token(row, ahead) for ahead, row in enumerate(probs)]


def test_draws_from_float32_logits_are_the_hosts_over_a_flat_vocabulary():
    """The device's distributions are float64 like the host's: from the same float32 logits, the same tokens,
    also where many tokens sit near the tail threshold."""
    logits = (np.random.default_rng(3).standard_normal((64, 151_936)) * 1.5).astype(np.float32)
    sampling = SamplingSettings(temperature=1.0)
    keys = SeededDraws(8).keys(64)
    on_device = device_sampling.race_rows(device_sampling.distributions(torch.from_numpy(logits), sampling),
                                          torch.from_numpy(keys)).tolist()
    assert on_device == [SeededDraws(8).token(distribution(row, sampling), ahead) for ahead, row in enumerate(logits)]


def test_race_rows_draw_the_host_token_where_no_token_reaches_the_threshold():
    flat = np.linspace(1.0, 3.0, 200_000)
    probs = np.stack([flat / flat.sum()] * 8)
    keys = SeededDraws(2).keys(8)
    on_device = device_sampling.race_rows(torch.from_numpy(probs), torch.from_numpy(keys)).tolist()
    assert on_device == [SeededDraws(2).token(row, ahead) for ahead, row in enumerate(probs)]


@pytest.mark.parametrize("draft, choices", [([5, 7, 9], [5, 7, 3, 8]), ([1, 2], [1, 2, 6]), ([], [4]),
                                            ([3], [0, 3])])
def test_greedy_verdict_equals_the_host_rule(draft, choices):
    logits = torch.full((len(choices), 12), -1.0)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 2.0
    verdict = device_sampling.verify_greedy(torch.tensor(draft, dtype=torch.long), logits).tolist()
    expected = verify_greedy(draft, choices)
    assert verdict == [expected.num_accepted, expected.next_token]


def _first_emitted_counts(verify_one, vocab_size: int, seed: int) -> np.ndarray:
    counts = np.zeros(vocab_size)
    for position in range(NUM_DRAWS):
        num_accepted, next_token, drafted = verify_one(SeededDraws(seed, 2 * position))
        counts[drafted if num_accepted > 0 else next_token] += 1
    return counts


def _expected_counts(probs: torch.Tensor) -> np.ndarray:
    probs = probs.double().numpy()
    return probs / probs.sum() * NUM_DRAWS  # float32 rows sum to 1 only up to rounding


@pytest.mark.parametrize("seed", [0, 1])
def test_a_model_draft_drawn_with_the_same_draws_keeps_the_target_distribution(seed):
    vocab_size = 6
    rng = np.random.default_rng(seed + 10)
    target = torch.from_numpy(rng.dirichlet(np.ones(vocab_size), size=2)).float()  # p at the draft, then the bonus
    draft = rng.dirichlet(np.ones(vocab_size))  # q, deliberately different

    def verify_one(draws):
        drafted = draws.token(draft)
        verdict = device_sampling.verify_sampled(torch.tensor([drafted]), target, torch.from_numpy(draws.keys(2)))
        return *verdict.tolist(), drafted

    counts = _first_emitted_counts(verify_one, vocab_size, seed)
    assert chisquare(counts, _expected_counts(target[0])).pvalue > 1e-3


def test_a_point_mass_draft_keeps_the_target_distribution():
    vocab_size = 5
    target = torch.from_numpy(np.random.default_rng(3).dirichlet(np.ones(vocab_size), size=3)).float()

    def verify_one(draws):
        drafted = [2, 4]  # an n-gram's guess, whatever p says
        verdict = device_sampling.verify_sampled(torch.tensor(drafted), target, torch.from_numpy(draws.keys(3)))
        return *verdict.tolist(), drafted[0]

    counts = _first_emitted_counts(verify_one, vocab_size, 4)
    assert chisquare(counts, _expected_counts(target[0])).pvalue > 1e-3


def test_a_draw_from_the_wrong_row_is_caught():
    """The χ² check above can fail: emitting the bonus row's draw in place of the rejected row's is biased."""
    vocab_size = 6
    target = torch.from_numpy(np.random.default_rng(5).dirichlet(np.ones(vocab_size) * 0.3, size=2)).float()

    def verify_one(draws):
        swapped = target.flip(0)  # the rows read in the wrong order
        verdict = device_sampling.verify_sampled(torch.tensor([0]), swapped, torch.from_numpy(draws.keys(2)))
        return *verdict.tolist(), 0

    counts = _first_emitted_counts(verify_one, vocab_size, 6)
    assert chisquare(counts, _expected_counts(target[0])).pvalue < 1e-6


def test_verify_equals_the_host_rule_and_choose_is_the_argmax_or_the_draw():
    logits = torch.from_numpy(np.random.default_rng(2).standard_normal((4, 40)).astype(np.float32) * 2)
    sampling = SamplingSettings(temperature=1.0)
    draws = SeededDraws(3)
    drafted = [draws.token(distribution(logits[row].numpy(), sampling), ahead=row) for row in range(3)]
    on_device = device_sampling.verify(torch.tensor(drafted), logits, sampling, torch.from_numpy(draws.keys(4)))
    expected = verify_logits(drafted, logits.numpy(), sampling, SeededDraws(3))
    assert on_device.tolist() == [expected.num_accepted, expected.next_token] == [3, expected.next_token]
    assert int(device_sampling.choose(logits[0], SamplingSettings(), torch.zeros(1, dtype=torch.long))) == \
        int(np.argmax(logits[0].numpy()))
    key = torch.from_numpy(draws.keys(1))
    assert int(device_sampling.choose(logits[0], sampling, key)) == drafted[0]


# A γ = 4 sampled verify ran 60 operators at temperature 1 and 77 with top-k and top-p (CPU torch 2.13,
# 2026-12-06; the version before ran 76 and 90): outside a CUDA graph every one is a launch on a GPU, so
# growth is a cost (issue 36).
MAX_OPERATORS_PER_SAMPLED_VERIFY = 85


def test_a_sampled_verify_runs_at_most_85_operators():
    from test_static_step import OperatorCount

    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0))
    keys, draft = torch.from_numpy(SeededDraws(1).keys(5)), torch.zeros(4, dtype=torch.long)
    counts = []
    for sampling in (SamplingSettings(temperature=1.0), SamplingSettings(temperature=0.8, top_k=40, top_p=0.95)):
        with OperatorCount() as operators:
            device_sampling.verify(draft, logits, sampling, keys)
        counts.append(operators.count)
    assert 0 < counts[0] < counts[1] <= MAX_OPERATORS_PER_SAMPLED_VERIFY


def test_top_p_keeps_the_same_tied_tokens_on_the_host_and_the_device():
    """Logits that tie (as bf16 ones often do) at the top-p cut: both keep the tied tokens in id order (a
    stable sort of the whole vocabulary), so a request samples alike alone (device) and in a batch (host)."""
    rng = np.random.default_rng(5)
    logits = rng.integers(0, 6, size=(40, 3000)).astype(np.float32)  # a few values, many ties each
    for top_p in (0.2, 0.5, 0.9):
        sampling = SamplingSettings(temperature=1.0, top_p=top_p)
        on_device = device_sampling.distributions(torch.from_numpy(logits), sampling).numpy()
        for row in range(len(logits)):
            assert np.array_equal(on_device[row] > 0, distribution(logits[row], sampling) > 0)
    # a tie across the host's 1024th candidate, with the cut inside it: 1000 tokens above, 2000 tied below
    straddling = np.where(rng.permutation(3000) < 1000, 5.0, 4.0).astype(np.float32)
    probs = distribution(straddling, SamplingSettings(temperature=1.0))
    above, tied = probs.max() * 1000, probs.min()
    sampling = SamplingSettings(temperature=1.0, top_p=float(above + 5.5 * tied))
    kept = distribution(straddling, sampling) > 0
    assert kept.sum() == 1006 and np.flatnonzero(kept & (straddling == 4.0)).tolist() == \
        np.flatnonzero(straddling == 4.0)[:6].tolist()  # the first tied ids, as a stable sort keeps them
    on_device = device_sampling.distributions(torch.from_numpy(straddling[None]), sampling).numpy()[0]
    assert np.array_equal(on_device > 0, kept)
