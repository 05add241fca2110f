"""MagicDec's cost terms for batches: the target's step grows with batch × context, a self-sparse draft's stays flat,
and the speedup and crossover that follow; measured on this machine, cached, and shown by `pocketspec plan --batch`."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
import torch

from memplanner.batch_step_costs import (CONTEXT_GRID, StepCosts, crossover_context, predicted_speedup,
                                         shape_step_costs)
from memplanner.shapes import shape_from_gguf
from memplanner.torch_sizes import torch_kv_bytes
from pocketspec.batch.batched_model import BatchedModel
from pocketspec.batch.step_calibration import measure_and_store, measure_step_costs
from pocketspec.batch.step_costs import BatchModel, BatchShape, batch_step_costs, cached_step_costs, step_costs_key
from pocketspec.batch_session import open_batch_session
from pocketspec.session_settings import SessionSettings
from pocketspec.settings import BatchSettings, ModelSettings
from pocketspec.torch_model.invariant import TileShape, make_batch_invariant
from pocketspec.torch_model.load import load_model
from test_cli_errors import assert_one_line_error, run_cli
from tiny_models import write_tiny_pair

# A model whose forward streams 0.1 s of weights and reads each cached token of each row in 10 µs, whose
# attention costs one tile of 4 queries at a time: the regime where a sparse draft pays at long contexts
KV_BOUND = StepCosts("kv-bound", {1: 0.1, 8: 0.1, 64: 0.2, 512: 1.0}, {0: 0.0, 1 << 20: 10.0},
                     {1: 1.0, 4: 1.0, 8: 2.0, 12: 3.0})


def test_a_forward_is_its_tokens_plus_each_rows_cached_tokens_by_query_tile():
    assert KV_BOUND.forward_seconds(1, 1, 0) == pytest.approx(0.1)
    one_row = KV_BOUND.forward_seconds(1, 1, 1000) - 0.1
    assert KV_BOUND.forward_seconds(8, 1, 1000) == pytest.approx(0.1 + 8 * one_row)
    assert KV_BOUND.forward_seconds(4, 4, 1000) == pytest.approx(KV_BOUND.forward_seconds(4, 1, 1000) + 0.1 * 8 / 56)
    # widths 5 to 8 pay a second tile (the next measured width's factor), past the table per query
    assert KV_BOUND.width_factor(5) == KV_BOUND.width_factor(8) == 2.0
    assert KV_BOUND.width_factor(24) == pytest.approx(6.0)


def test_a_windowed_draft_costs_the_same_at_any_context():
    draft = KV_BOUND.with_window(256)
    assert draft.forward_seconds(16, 1, 8000) == draft.forward_seconds(16, 1, 0) == \
        KV_BOUND.forward_seconds(16, 1, 256)


@pytest.mark.parametrize("costs", [KV_BOUND, KV_BOUND.with_window(256)])
def test_the_controllers_table_reads_the_same_costs(costs):
    table = costs.for_rows(4, max_width=9, max_context=8192)
    for width in (1, 2, 5, 9):
        for depth in (0, 100, 4000, 8192):
            expected = costs.forward_seconds(4, width, depth)
            assert table.forward_seconds(width, depth) == pytest.approx(expected), (width, depth)


def test_step_costs_survive_json():
    assert StepCosts.from_json(json.loads(json.dumps(KV_BOUND.to_json()))) == KV_BOUND


@pytest.mark.parametrize("field, value", [("token_seconds", {"1": 0}), ("token_seconds", {"1": float("inf")}),
                                          ("token_seconds", {}), ("kv_seconds", {"0": -1.0}),
                                          ("kv_width_factor", {"1": float("nan")}), ("token_seconds", {"0": 0.01})])
def test_step_costs_no_measurement_wrote_are_refused(field, value):
    """cached_step_costs takes the ValueError for an unreadable table, and measures again."""
    with pytest.raises(ValueError):
        StepCosts.from_json({**KV_BOUND.to_json(), field: value})


def test_the_speedup_grows_with_context_at_every_batch_and_pays_from_the_crossover():
    draft = KV_BOUND.with_window(256)
    for num_rows in (1, 4, 8, 16):
        speedups = [predicted_speedup(KV_BOUND, draft, num_rows=num_rows, context=context, alpha=0.7,
                                      max_gamma=8).speedup for context in (512, 2048, 8192, 32768)]
        assert speedups == sorted(speedups) and speedups[-1] > 1.3, (num_rows, speedups)
        crossover = crossover_context(KV_BOUND, draft, num_rows=num_rows, alpha=0.7, max_gamma=8, max_context=32768)
        assert crossover is not None and crossover in CONTEXT_GRID
        before = predicted_speedup(KV_BOUND, draft, num_rows=num_rows, context=crossover - 256, alpha=0.7, max_gamma=8)
        assert crossover == CONTEXT_GRID[0] or before.gamma == 0


def test_a_draft_as_dear_as_the_target_never_pays():
    same = KV_BOUND.with_window(1 << 20)
    assert crossover_context(KV_BOUND, same, num_rows=8, alpha=0.8, max_gamma=8, max_context=32768) is None
    assert predicted_speedup(KV_BOUND, same, num_rows=8, context=8192, alpha=0.8, max_gamma=8).speedup == 1.0


def test_the_roofline_reads_every_cached_byte_and_predicts_the_long_context_regime(smollm2_path):
    shape = shape_from_gguf(smollm2_path)
    costs = shape_step_costs(shape, weights_format="fp32", kv_dtype="fp32", is_tied=True, on_gpu=False)
    kv_seconds_per_token = costs.forward_seconds(1, 1, 1 << 20) - costs.forward_seconds(1, 1, 0)
    ratio = kv_seconds_per_token / (1 << 20) / (torch_kv_bytes(shape, "fp32", 1) / 20e9)
    assert ratio == pytest.approx(1.0)  # bandwidth-bound at one query a row on the reference CPU
    draft = costs.with_window(256)
    assert predicted_speedup(costs, draft, num_rows=16, context=512, alpha=0.8, max_gamma=8).gamma == 0
    assert predicted_speedup(costs, draft, num_rows=16, context=8192, alpha=0.8, max_gamma=8).speedup > 1.2


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_step_costs"), quant=None)[0]


def _batched_tiny(tiny_target, *, num_rows: int, max_context: int, max_logits_rows: int) -> BatchedModel:
    """The tiny target as a batch-invariant pool on the CPU."""
    settings = replace(BatchSettings(), is_batch_invariant=True, key_block=32)
    model = load_model(tiny_target, "fp32", torch.device("cpu"))
    tiles = TileShape(settings.row_tile)
    make_batch_invariant(model, tiles)
    return BatchedModel(model, num_rows=num_rows, max_context=max_context, kv_dtype="fp32", n_batch=64,
                        settings=settings, tiles=tiles, max_logits_rows=max_logits_rows)


def test_a_batch_is_timed_by_how_much_it_holds_and_left_empty(tiny_target, one_torch_thread):
    batched = _batched_tiny(tiny_target, num_rows=4, max_context=256, max_logits_rows=6)
    costs, spread = measure_step_costs(batched, "tiny", max_rows=3, num_rounds=1)
    assert sorted(costs.token_seconds) == [1, 2, 3, 6, 15, 18]  # up to 3 rows x 6 verify rows
    assert sorted(costs.kv_seconds) == [0, 62, 3 * 62, 250, 3 * 250]  # a quarter of 250 and 250, at 1 and 3 rows
    assert sorted(costs.kv_width_factor) == [1, 2, 4, 5, 6]
    factors = [costs.kv_width_factor[width] for width in sorted(costs.kv_width_factor)]
    assert factors == sorted(factors) and factors[0] == 1.0
    assert len(spread) == 6 + 4 + 4 and costs.is_measured
    assert all(batched.num_cached(row) == 0 for row in range(4))
    batched.prefill(0, [5, 6, 7])  # the rows are usable again
    with pytest.raises(ValueError, match="holds 0 to 256"):
        batched.hold_for_timing(0, 257)


def test_a_batch_table_that_cannot_be_saved_is_used_and_said_so(tiny_target, one_torch_thread, tmp_path,
                                                               monkeypatch):
    """POCKETSPEC_HOME/costs is a file: the measurement is still returned, with a line that it is not cached. A
    clock that ticks once a call times every forward alike, so the table's repeats agree."""
    (tmp_path / "costs").write_text("not a folder")
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    batched = _batched_tiny(tiny_target, num_rows=2, max_context=128, max_logits_rows=4)
    messages, ticks = [], itertools.count()
    costs = measure_and_store(batched, "tiny", max_rows=2, on_measure=messages.append,
                              clock=lambda: float(next(ticks)))
    assert costs.is_measured and costs.token_seconds[1] == 1.0
    assert len(messages) == 2 and "could not save" in messages[1] and "measures them again" in messages[1]


def test_an_uncalibrated_shape_is_priced_by_its_roofline(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    shape = BatchShape(4, 512, 9, True, "fp32", 2)
    settings = ModelSettings(backend="torch")
    assert cached_step_costs(step_costs_key(tiny_target, settings, shape)) is None
    costs = batch_step_costs(BatchModel("draft (self-sparse)", tiny_target, shape, is_window=True), settings)
    assert not costs.is_measured and costs.fixed_context == 512
    assert step_costs_key(tiny_target, settings, replace(shape, num_rows=8)) != step_costs_key(tiny_target, settings,
                                                                                               shape)


def test_the_batch_engine_prices_its_steps_with_the_targets_terms_and_the_drafts_window(tiny_target, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    settings = SessionSettings(target=str(tiny_target), draft="self-sparse", max_context=512, threads=1,
                               options={"backend": "torch", "self_draft_window": 96})
    with open_batch_session(settings, BatchSettings(max_batch=2)) as session:
        target_costs, draft_costs = session.engine.target_costs, session.engine.draft_costs
    assert isinstance(target_costs, StepCosts) and target_costs.fixed_context is None
    assert draft_costs.fixed_context == 96 and not draft_costs.is_measured  # nothing calibrated in this home
    group = session.engine.controller_for(2)
    assert group.target_costs.seconds(1, 400) > group.target_costs.seconds(1, 0)  # the target's grows with context
    assert group.draft_costs.seconds(1, 400) == group.draft_costs.seconds(1, 0)  # the draft's does not


def test_doctor_measures_what_plan_then_predicts_from(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    batch = ["--target", str(tiny_target), "--draft", "self-sparse", "--backend", "torch", "--batch", "2",
             "--max-context", "512", "--self-draft-window", "96", "--threads", "1"]
    plan = run_cli("plan", *batch, "--memory-budget", "2GiB")
    assert plan.returncode == 0, plan.stderr
    assert "roofline" in plan.stdout and "self-sparse KV × 2 rows" in plan.stdout
    assert "crossover:" in plan.stdout and "   512" in plan.stdout
    doctor = run_cli("doctor", "--calibrate", *batch)
    assert doctor.returncode == 0, doctor.stderr
    assert "target:" in doctor.stdout and "draft (self-sparse):" in doctor.stdout
    is_cached = "varied by more than" not in doctor.stderr  # a busy machine's table is used once, not cached
    measured = json.loads(run_cli("plan", *batch, "--memory-budget", "2GiB", "--json").stdout)
    assert measured["costs_measured"] == is_cached and measured["max_batch"] == 2
    assert [item["context"] for item in measured["predictions"]] == [512]


@pytest.mark.parametrize("args, fragments", [
    (["plan", "--batch", "4"], ["plan --batch", "--backend torch"]),
    (["plan", "--backend", "torch"], ["--batch N"]),
    (["doctor", "--batch", "4"], ["--calibrate"]),
    (["doctor", "--calibrate"], ["--batch N"]),
    (["doctor", "--calibrate", "--batch", "2"], ["--calibrate --batch", "--backend torch"]),
    (["plan", "--batch", "2", "--backend", "torch", "--devices", "cpu:0,cpu:1", "--memory-budget", "1GiB,1GiB"],
     ["one device"]),
])
def test_batch_plans_and_calibrations_refuse_what_they_cannot_do(tiny_target, args, fragments):
    assert_one_line_error(run_cli(*args, "--target", str(tiny_target), "--max-context", "512"), *fragments)
