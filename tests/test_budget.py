"""`--memory-budget` end to end: the plan sizes the runtime, and the run stays inside it."""

from __future__ import annotations

import json

from test_cli_errors import run_cli


def _generate_json(*flags: str) -> tuple[dict, str]:
    result = run_cli("generate", "--target", "smollm2-135m-instruct", "--prompt", "Count to ten:",
                     "--max-tokens", "12", "--json", *flags)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_the_plan_is_announced_and_the_peak_stays_inside_the_budget():
    output, notes = _generate_json("--draft", "ngram", "--memory-budget", "400MiB", "--max-context", "1024")
    assert "memory plan: predicted peak" in notes
    stats = output["stats"]
    assert stats["memory_budget_bytes"] == 400 * 2**20
    assert 0 < stats["peak_memory_bytes"] <= stats["memory_budget_bytes"]


def test_draft_none_plans_plain_decoding():
    output, notes = _generate_json("--draft", "none", "--memory-budget", "1GiB")
    assert "drafter none" in notes and output["stats"]["num_drafted"] == 0


def test_a_tight_budget_degrades_and_is_announced():
    from memplanner.planner import Workload, min_budget_any
    from memplanner.shapes import shape_from_gguf
    from pocketspec.catalog import model_path

    minimum = min_budget_any(shape_from_gguf(model_path("smollm2-135m-instruct")), Workload(max_context=4096))
    output, notes = _generate_json("--draft", "ngram", "--memory-budget", str(minimum), "--max-context", "4096")
    assert "memory plan:" in notes
    assert output["stats"]["peak_memory_bytes"] <= minimum


def test_a_budget_below_the_repacked_minimum_runs_with_weights_not_repacked():
    from memplanner.planner import Workload, min_budget_any
    from memplanner.shapes import shape_from_gguf
    from pocketspec.catalog import model_path

    shape, workload = shape_from_gguf(model_path("qwen2.5-coder-1.5b-instruct")), Workload(max_context=512)
    unrepacked, repacked = (min_budget_any(shape, workload, repack=(choice,)) for choice in (False, True))
    budget = (unrepacked + repacked) // 2
    result = run_cli("generate", "--target", "qwen2.5-coder-1.5b-instruct", "--draft", "none", "--prompt", "def add(",
                     "--max-tokens", "8", "--max-context", "512", "--memory-budget", str(budget), "--json")
    assert result.returncode == 0, result.stderr
    assert "weights not repacked" in result.stderr
    assert 0 < json.loads(result.stdout)["stats"]["peak_memory_bytes"] <= budget
    forced = run_cli("generate", "--target", "qwen2.5-coder-1.5b-instruct", "--draft", "none", "--prompt", "def add(",
                     "--max-tokens", "8", "--max-context", "512", "--memory-budget", str(budget), "--repack")
    assert forced.returncode == 2 and "is below the minimum" in forced.stderr


def test_one_named_gpu_is_planned_as_that_gpu_with_its_own_free_memory(smollm2_path):
    """`--devices cuda:1 --memory-budget 6GiB` offloads every block, so the plan is a GPU plan for GPU 1,
    budgeted by what that GPU (here a described one) has free; it used to be a CPU plan."""
    from apps.budget import apply_plan, planned_device_name
    from memplanner import constants
    from memplanner.device import DeviceInfo
    from pocketspec.loader import ModelChoice
    from pocketspec.settings import ModelSettings, SpeculationSettings

    settings = ModelSettings(devices=("cuda:1",), max_context=1024)
    assert planned_device_name(settings) == "cuda:1"
    assert planned_device_name(ModelSettings(gpu_layers=-1)) == "cuda:0" and planned_device_name(ModelSettings()) == "cpu"
    described = DeviceInfo("cuda", "cuda:1 (described)", 8 * 2**30, 700 * 2**20)
    applied = apply_plan(ModelChoice(smollm2_path, None, "ngram"), "6GiB", settings, SpeculationSettings(), 64, 0.0,
                         None, device=described)
    assert applied.plan.settings.target_device == "cuda" and applied.budget_bytes == 700 * 2**20
    assert applied.plan.terms["runtime_overhead"] == constants.ESTIMATED_CUDA_OVERHEAD_BYTES
    assert "target_repacked_weights" not in applied.plan.terms
    assert any("700.00 MiB free now" in note for note in applied.notes)


def test_a_gpu_this_process_cannot_read_is_planned_for_the_whole_budget(smollm2_path):
    from apps.budget import apply_plan
    from pocketspec.loader import ModelChoice
    from pocketspec.settings import ModelSettings, SpeculationSettings

    applied = apply_plan(ModelChoice(smollm2_path, None, "ngram"), "3GiB", ModelSettings(devices=("cuda:7",)),
                         SpeculationSettings(), 64, 0.0, None)
    assert applied.plan.settings.target_device == "cuda" and applied.budget_bytes == 3 * 2**30
    assert any("cannot read cuda:7's free memory" in note for note in applied.notes)
