"""This machine's cost table: measured once on a real model, cached by what decides the cost, used to leave out a draft model."""

from dataclasses import replace

import pytest

from memplanner.measured_costs import MeasuredCosts
from pocketspec.calibrate import cached_costs, calibrated_costs, cost_key, cost_table_path
from pocketspec.cost_samples import disagreeing_share, is_trusted
from pocketspec.loader import ModelChoice, draft_cannot_pay
from pocketspec.settings import ModelSettings, SpeculationSettings
from pocketspec.untrusted_runs import MAX_UNTRUSTED_RUNS


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    return tmp_path


@pytest.mark.real_model
def test_a_real_model_is_measured_once_then_read_from_the_cache(home, smollm2_path):
    from pocketspec.backends.llama_cpp_backend import LlamaCppBackend

    settings = ModelSettings(max_context=600, max_logits_rows=12, num_threads=1)
    messages = []
    with LlamaCppBackend(smollm2_path, settings) as backend:
        costs = calibrated_costs(backend, min_width=12, on_measure=messages.append)
        assert costs.depths == [0, backend.max_context - 12 - 1]
        assert costs.max_width == 12
        assert all(seconds > 0 for row in costs.seconds.values() for seconds in row.values())
        assert backend.num_cached == 0  # the measurement leaves the cache empty
        if not is_trusted(costs.spread):  # a busy machine: used once, said so, not cached
            assert len(messages) == 2 and "varied by more than" in messages[1]
            assert cached_costs(smollm2_path, settings) is None
            pytest.skip(f"this machine was too busy to cache a table ({disagreeing_share(costs.spread):.0%} of "
                        "its widths disagreed)")
        assert len(messages) == 1
        assert calibrated_costs(backend, min_width=12, on_measure=messages.append) == costs
        assert len(messages) == 1  # the second call read the cache
    assert cached_costs(smollm2_path, settings) == costs
    assert cached_costs(smollm2_path, settings, min_width=13) is None  # a wider verify needs a new measurement
    assert cached_costs(smollm2_path, replace(settings, num_threads=2)) is None


def test_the_key_changes_with_what_decides_the_cost(smollm2_path):
    settings = ModelSettings(num_threads=2)
    keys = {cost_key(smollm2_path, settings), cost_key(smollm2_path, replace(settings, num_threads=1)),
            cost_key(smollm2_path, replace(settings, repack_weights=False)),
            cost_key(smollm2_path, replace(settings, kv_type="q8_0"))}
    assert len(keys) == 4
    assert cost_key(smollm2_path, replace(settings, max_context=512, max_logits_rows=3)) == cost_key(smollm2_path, settings)


def test_the_key_tells_the_row_exact_kernels_from_the_stock_ones(smollm2_path):
    """A verify costs less with the row-exact kernels: a table measured with the stock ones (the same build
    with GGML_CPU_ROW_EXACT=0, read once per process, so in a child) is another table."""
    import os
    import subprocess
    import sys

    from pocketspec.backends.ggml_ops import row_exact_max_rows

    script = ("import sys; from pocketspec.calibrate import cost_key; from pocketspec.settings import ModelSettings; "
              "print(cost_key(sys.argv[1], ModelSettings(num_threads=2)))")
    stock = subprocess.run([sys.executable, "-c", script, str(smollm2_path)], capture_output=True, text=True,
                           check=True, env={**os.environ, "GGML_CPU_ROW_EXACT": "0"}).stdout.strip()
    here = cost_key(smollm2_path, ModelSettings(num_threads=2))
    assert '"row_exact": 0' in stock
    assert (stock != here) == (row_exact_max_rows() > 0)


def test_the_key_tells_one_build_of_the_kernels_from_another(smollm2_path, tmp_path, monkeypatch):
    """Another build of ggml's CPU library (a new version of the row-exact patch, say) may price every
    width differently, so the table is measured again for it. A copy of the installed library stands
    for the installed one, so that no other test sees its date move."""
    import os
    import shutil

    from pocketspec.backends import ggml_ops

    copy = ggml_ops.cpu_library(tmp_path)
    shutil.copy2(ggml_ops.cpu_library(), copy)
    monkeypatch.setattr(ggml_ops, "installed_lib_dir", lambda: tmp_path)
    first = cost_key(smollm2_path, ModelSettings(num_threads=2))
    assert cost_key(smollm2_path, ModelSettings(num_threads=2)) == first
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert cost_key(smollm2_path, ModelSettings(num_threads=2)) != first


STEPPED_CPU = {width: 0.037 * ratio for width, ratio in {1: 1.0, 2: 1.6, 3: 2.2, 4: 2.6, 8: 6.0, 16: 6.1, 32: 12}.items()}
NEARLY_FREE_VERIFY = {width: 0.020 * (1 + 0.02 * (width - 1)) for width in range(1, 33)}


@pytest.mark.parametrize("seconds, loaded", [(STEPPED_CPU, False), (NEARLY_FREE_VERIFY, True)])
def test_a_pairs_draft_model_is_loaded_only_where_it_can_pay(home, qwen_target_path, qwen_draft_path, seconds, loaded):
    target_costs = MeasuredCosts("measured", {0: dict(seconds)}, weight_bytes=1_111_370_240)
    choice = ModelChoice(qwen_target_path, qwen_draft_path, "auto")
    reason = draft_cannot_pay(choice, target_costs, ModelSettings(), SpeculationSettings())
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
    reason = draft_cannot_pay(choice, target_costs, ModelSettings(), SpeculationSettings())
    assert reason is not None and f"{predicted:.2f}x" in reason


def test_a_named_draft_model_is_always_loaded(home, qwen_target_path, qwen_draft_path):
    target_costs = MeasuredCosts("measured", {0: dict(STEPPED_CPU)}, weight_bytes=1_111_370_240)
    choice = ModelChoice(qwen_target_path, qwen_draft_path, "auto", draft_is_explicit=True)
    assert draft_cannot_pay(choice, target_costs, ModelSettings(), SpeculationSettings()) is None


@pytest.mark.real_model
def test_doctor_calibrate_measures_the_table_of_the_cache_type_and_layout_asked_for(home, smollm2_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "apps.cli", "doctor", "--calibrate", "--target", str(smollm2_path),
                             "--draft", "none", "--threads", "1", "--kv-type", "bf16", "--no-repack"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert smollm2_path.name in result.stdout and "depth" in result.stdout and "±" in result.stdout
    settings = ModelSettings(num_threads=1, kv_type="bf16", repack_weights=False)
    if cached_costs(smollm2_path, settings) is None:  # a busy machine: shown, said so, and not cached
        assert "between repeats" in result.stderr and "measures them again" in result.stderr
    else:
        assert "between repeats" not in result.stderr
    assert cached_costs(smollm2_path, replace(settings, kv_type="f16")) is None
    assert cached_costs(smollm2_path, replace(settings, repack_weights=True)) is None


class StandInBackend:
    """A backend whose forward of w rows takes seconds_by_width(w, n) on a virtual clock, n counting the
    timed forwards of that width: a machine whose speed is known exactly, busy spells included."""

    def __init__(self, model_path, seconds_by_width, max_context: int = 600):
        from pocketspec.settings import ModelSettings

        self.model_path, self.settings = model_path, ModelSettings(num_threads=2)
        self.seconds_by_width = seconds_by_width
        self.max_context, self.max_logits_rows, self.vocab_size, self.n_batch = max_context, 32, 49152, 512
        self.now, self.num_cached = 0.0, 0
        self.num_forwards: dict[int, int] = {}

    def clock(self) -> float:
        return self.now

    def rollback(self, num_kept: int) -> None:
        self.num_cached = min(self.num_cached, num_kept)

    def prefill(self, tokens):
        self.num_cached += len(tokens)

    def forward(self, tokens, rows):
        width = len(tokens)
        count = self.num_forwards[width] = self.num_forwards.get(width, 0) + 1
        self.now += self.seconds_by_width(width, count)
        self.num_cached += width

    def memory_report(self) -> dict:
        return {"weights": 1000}


def _curve(width: int) -> float:
    return 0.03 * (1 + 0.5 * (width - 1)) if width < 8 else 0.03 * (4 + 0.1 * width)


def test_a_quiet_machines_table_is_its_curve_and_is_cached(home, smollm2_path):
    backend = StandInBackend(smollm2_path, lambda width, count: _curve(width))
    costs = calibrated_costs(backend, min_width=32, clock=backend.clock)
    assert costs.seconds[0] == {width: pytest.approx(_curve(width)) for width in costs.seconds[0]}
    assert disagreeing_share(costs.spread) == 0.0 and cached_costs(smollm2_path, backend.settings, 32) == costs
    assert set(backend.num_forwards.values()) == {3 * len(costs.depths)} | {3 * len(costs.depths) + 2}  # + warm-ups


def test_a_stray_slow_pass_is_outvoted_by_the_median(home, smollm2_path):
    backend = StandInBackend(smollm2_path, lambda width, count: _curve(width) * (3.0 if count == 2 else 1.0))
    costs = calibrated_costs(backend, min_width=32, clock=backend.clock)
    assert costs.seconds[0][16] == pytest.approx(_curve(16)) and cached_costs(smollm2_path, backend.settings, 32)


def test_repeats_that_keep_disagreeing_are_measured_again_then_used_once_and_not_cached(home, smollm2_path):
    """Widths 9-16 take 1.15x, 1.15²x, 1.15³x ... of their cost, pass after pass: a neighbour ever busier. They
    get the extra rounds, the table is still used for the run that measured it, and the next run measures
    again. One such width alone would not condemn the table."""
    def busy_from_9_to_16(width: int, count: int) -> float:
        return _curve(width) * 1.15 ** count if 9 <= width <= 16 else _curve(width)

    backend = StandInBackend(smollm2_path, busy_from_9_to_16)
    messages = []
    costs = calibrated_costs(backend, min_width=32, on_measure=messages.append, clock=backend.clock)
    assert disagreeing_share(costs.spread) == pytest.approx(8 / 20) and costs.spread[0][12] == pytest.approx(0.15)
    assert backend.num_forwards[12] > backend.num_forwards[20]  # the extra rounds went to the busy widths
    assert cached_costs(smollm2_path, backend.settings, 32) is None
    assert len(messages) == 2 and "at 40% of the widths" in messages[1] and "measures them again" in messages[1]
    one_noisy = StandInBackend(smollm2_path, lambda width, count: busy_from_9_to_16(width, count) if width == 12
                               else _curve(width))
    assert is_trusted(calibrated_costs(one_noisy, min_width=32, force=True, clock=one_noisy.clock).spread)


def test_a_machine_busy_at_every_start_caches_its_third_table_in_a_row(home, smollm2_path):
    """Not caching a disagreeing table meant a machine that is never quiet measured at every start for good (a
    minute for the 1.5B target). A run whose table agrees starts the count again."""
    def busy(width: int, count: int) -> float:
        return _curve(width) * 1.15 ** count if width >= 9 else _curve(width)

    settings = ModelSettings(num_threads=2)  # StandInBackend's

    def run(seconds_by_width) -> list[str]:
        backend, messages = StandInBackend(smollm2_path, seconds_by_width), []
        calibrated_costs(backend, min_width=32, on_measure=messages.append, clock=backend.clock)
        return messages

    assert "measures them again" in run(busy)[1] and cached_costs(smollm2_path, settings, 32) is None
    assert len(run(lambda width, count: _curve(width))) == 1  # a quiet start: cached, the count starts again
    cost_table_path(cached_costs(smollm2_path, settings, 32).key).unlink()
    for _ in range(MAX_UNTRUSTED_RUNS - 1):
        assert "measures them again" in run(busy)[1] and cached_costs(smollm2_path, settings, 32) is None
    last = run(busy)[1]
    assert f"in {MAX_UNTRUSTED_RUNS} runs in a row" in last and "cached anyway" in last
    cached = cached_costs(smollm2_path, settings, 32)
    assert cached is not None and not is_trusted(cached.spread)
    assert not list(cost_table_path(cached.key).parent.glob("*.untrusted.json"))


def test_a_cost_per_row_that_rises_is_measured_again_and_kept_when_its_repeats_agree(home, smollm2_path):
    backend = StandInBackend(smollm2_path, lambda width, count: _curve(width) * (2.0 if width == 20 else 1.0))
    costs = calibrated_costs(backend, min_width=32, clock=backend.clock)
    assert backend.num_forwards[20] > backend.num_forwards[16]
    assert costs.seconds[0][20] == pytest.approx(2 * _curve(20)) and cached_costs(smollm2_path, backend.settings, 32)


def test_a_table_that_cannot_be_saved_is_used_and_said_so(tmp_path, monkeypatch, smollm2_path):
    """POCKETSPEC_HOME/costs is a file, not a folder: the run goes on with the table and says it is not cached."""
    (tmp_path / "costs").write_text("not a folder")
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    backend = StandInBackend(smollm2_path, lambda width, count: _curve(width))
    messages = []
    costs = calibrated_costs(backend, min_width=32, on_measure=messages.append, clock=backend.clock)
    assert costs.seconds[0][16] == pytest.approx(_curve(16))
    assert len(messages) == 2 and "could not save" in messages[1] and "measures them again" in messages[1]


def test_doctor_calibrate_json_prints_the_measured_tables(home, tmp_path):
    """--json with --calibrate prints the tables as JSON, as --json alone prints the report (it printed the text)."""
    import json
    import subprocess
    import sys

    from tiny_models import write_tiny_pair

    (tmp_path / "tiny").mkdir()
    target, _ = write_tiny_pair(tmp_path / "tiny")
    result = subprocess.run([sys.executable, "-m", "apps.cli", "doctor", "--calibrate", "--json", "--target",
                             str(target), "--draft", "none", "--threads", "1"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    [table] = json.loads(result.stdout)["tables"]
    assert table["model"] == target.name and MeasuredCosts.from_json(table).max_width == 32
