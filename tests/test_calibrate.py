"""This machine's cost table: measured once on a real model, cached by what decides the cost, used to leave out a draft model."""

from dataclasses import replace

import pytest

from memplanner.measured_costs import MeasuredCosts
from pocketspec.calibrate import cached_costs, calibrated_costs, cost_key
from pocketspec.loader import ModelChoice, _draft_cannot_pay
from pocketspec.settings import ModelSettings, SpeculationSettings


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    return tmp_path


@pytest.mark.real_model
def test_a_real_model_is_measured_once_then_read_from_the_cache(home, smollm2_path):
    from pocketspec.backends.llama_cpp_backend import LlamaCppBackend

    settings = ModelSettings(max_context=600, max_logits_rows=12, num_threads=2)
    messages = []
    with LlamaCppBackend(smollm2_path, settings) as backend:
        costs = calibrated_costs(backend, min_width=12, on_measure=messages.append)
        assert len(messages) == 1
        assert costs.depths == [0, backend.max_context - 12 - 1]
        assert costs.max_width == 12
        assert all(seconds > 0 for row in costs.seconds.values() for seconds in row.values())
        assert backend.num_cached == 0  # the measurement leaves the cache empty
        assert calibrated_costs(backend, min_width=12, on_measure=messages.append) == costs
        assert len(messages) == 1  # the second call read the cache
    assert cached_costs(smollm2_path, settings) == costs
    assert cached_costs(smollm2_path, settings, min_width=13) is None  # a wider verify needs a new measurement
    assert cached_costs(smollm2_path, replace(settings, num_threads=1)) is None


def test_the_key_changes_with_what_decides_the_cost(smollm2_path):
    settings = ModelSettings(num_threads=2)
    keys = {cost_key(smollm2_path, settings), cost_key(smollm2_path, replace(settings, num_threads=1)),
            cost_key(smollm2_path, replace(settings, repack_weights=False)),
            cost_key(smollm2_path, replace(settings, kv_type="q8_0"))}
    assert len(keys) == 4
    assert cost_key(smollm2_path, replace(settings, max_context=512, max_logits_rows=3)) == cost_key(smollm2_path, settings)


STEPPED_CPU = {width: 0.037 * ratio for width, ratio in {1: 1.0, 2: 1.6, 3: 2.2, 4: 2.6, 8: 6.0, 16: 6.1, 32: 12}.items()}
NEARLY_FREE_VERIFY = {width: 0.020 * (1 + 0.02 * (width - 1)) for width in range(1, 33)}


@pytest.mark.parametrize("seconds, loaded", [(STEPPED_CPU, False), (NEARLY_FREE_VERIFY, True)])
def test_a_pairs_draft_model_is_loaded_only_where_it_can_pay(home, qwen_target_path, qwen_draft_path, seconds, loaded):
    target_costs = MeasuredCosts("measured", {0: dict(seconds)}, weight_bytes=1_111_370_240)
    choice = ModelChoice(qwen_target_path, qwen_draft_path, "auto")
    reason = _draft_cannot_pay(choice, target_costs, ModelSettings(), SpeculationSettings())
    assert (reason is None) == loaded
    if reason is not None:
        assert qwen_draft_path.name in reason and "--draft" in reason


def test_a_draft_model_predicted_within_the_tables_noise_of_plain_decoding_is_not_loaded(
        home, qwen_target_path, qwen_draft_path):
    """Each row past the first costs 0.3 of one here: the 0.5B draft, scaled from the target's table by weight
    bytes, predicts a few per cent over plain decoding at the prior, inside the noise of a table
    measured on a shared CPU, so it is not loaded for that."""
    from memplanner.defaults import ACCEPTANCE_PRIORS, DRAFT_MODEL_MIN_SPEEDUP
    from memplanner.measured_costs import MachineCosts, best_draft_model_speedup
    from memplanner.shapes import shape_from_gguf

    seconds = {width: 0.037 * (1 + 0.3 * (width - 1)) for width in range(1, 33)}
    target_costs = MeasuredCosts("measured", {0: seconds}, weight_bytes=1_111_370_240)
    target_only = MachineCosts(((shape_from_gguf(qwen_target_path), target_costs),))
    draft_costs = target_only.table_for(shape_from_gguf(qwen_draft_path))
    predicted, _ = best_draft_model_speedup(target_costs, draft_costs, ACCEPTANCE_PRIORS["model"],
                                            SpeculationSettings().max_gamma)
    assert 1.0 < predicted < DRAFT_MODEL_MIN_SPEEDUP
    choice = ModelChoice(qwen_target_path, qwen_draft_path, "auto")
    reason = _draft_cannot_pay(choice, target_costs, ModelSettings(), SpeculationSettings())
    assert reason is not None and f"{predicted:.2f}x" in reason


def test_a_named_draft_model_is_always_loaded(home, qwen_target_path, qwen_draft_path):
    target_costs = MeasuredCosts("measured", {0: dict(STEPPED_CPU)}, weight_bytes=1_111_370_240)
    choice = ModelChoice(qwen_target_path, qwen_draft_path, "auto", draft_is_explicit=True)
    assert _draft_cannot_pay(choice, target_costs, ModelSettings(), SpeculationSettings()) is None


@pytest.mark.real_model
def test_doctor_calibrate_measures_the_table_of_the_cache_type_and_layout_asked_for(home, smollm2_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "apps.cli", "doctor", "--calibrate", "--target", str(smollm2_path),
                             "--draft", "none", "--threads", "2", "--kv-type", "bf16", "--no-repack"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert smollm2_path.name in result.stdout and "depth" in result.stdout
    settings = ModelSettings(num_threads=2, kv_type="bf16", repack_weights=False)
    assert cached_costs(smollm2_path, settings) is not None
    assert cached_costs(smollm2_path, replace(settings, kv_type="f16")) is None
    assert cached_costs(smollm2_path, replace(settings, repack_weights=True)) is None
