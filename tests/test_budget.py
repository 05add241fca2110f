"""`--memory-budget` end to end: the plan sizes the runtime, and the run stays inside it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from pocketspec.stats import vm_hwm_bytes
from test_cli_errors import assert_one_line_error, run_cli


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


def test_a_budget_keeps_the_context_asked_for():
    """The plan counts γ + 1 verify cells past --max-context; as the runtime's context they let a budgeted run
    decode past it (400 tokens in a context of 256, where the run without a budget stopped at 238, context full)."""
    flags = ["--prompt", "Count from 1 to 500: 1, 2, 3,", "--draft", "ngram", "--gamma", "4", "--max-context", "256",
             "--max-tokens", "400", "--threads", "1"]
    alone, _ = _generate_json(*flags)
    budgeted, _ = _generate_json(*flags, "--memory-budget", "1GiB")
    assert alone["stop_reason"] == "context_full" and len(alone["tokens"]) < 256
    assert budgeted["tokens"] == alone["tokens"] and budgeted["stop_reason"] == "context_full"


def test_a_tight_budget_degrades_and_is_announced():
    from memplanner.planner import Workload, min_budget_any
    from memplanner.shapes import shape_from_gguf
    from pocketspec.models.catalog import model_path

    minimum = min_budget_any(shape_from_gguf(model_path("smollm2-135m-instruct")), Workload(max_context=4096))
    output, notes = _generate_json("--draft", "ngram", "--memory-budget", str(minimum), "--max-context", "4096")
    assert "memory plan:" in notes
    assert output["stats"]["peak_memory_bytes"] <= minimum


def test_the_repacked_target_runs_at_the_minimum_read_without_mmap():
    """Repacked weights held once (no mmap) fit where the mapped file plus the repacked copy did not."""
    from memplanner.planner import Workload, min_budget_any
    from memplanner.shapes import shape_from_gguf
    from pocketspec.models.catalog import model_path

    shape, workload = shape_from_gguf(model_path("qwen2.5-coder-1.5b-instruct")), Workload(max_context=512)
    repacked, unrepacked = (min_budget_any(shape, workload, repack=(choice,)) for choice in (True, False))
    assert repacked < unrepacked
    result = run_cli("generate", "--target", "qwen2.5-coder-1.5b-instruct", "--draft", "none", "--prompt", "def add(",
                     "--max-tokens", "8", "--max-context", "512", "--memory-budget", str(repacked), "--json")
    assert result.returncode == 0, result.stderr
    assert "weights not repacked" not in result.stderr
    assert 0 < json.loads(result.stdout)["stats"]["peak_memory_bytes"] <= repacked
    forced = run_cli("generate", "--target", "qwen2.5-coder-1.5b-instruct", "--draft", "none", "--prompt", "def add(",
                     "--max-tokens", "8", "--max-context", "512", "--memory-budget", str(repacked), "--no-repack")
    assert forced.returncode == 2 and "is below the minimum" in forced.stderr


def test_peak_memory_is_the_whole_process_high_water_mark():
    """--json's peak_memory_bytes is the process's VmHWM, interpreter and CLI modules included."""
    budget = 400 * 2**20
    child = subprocess.Popen([sys.executable, "-m", "apps.cli", "generate", "--target", "smollm2-135m-instruct",
                              "--draft", "ngram", "--prompt", "Count to ten:", "--max-tokens", "12", "--json",
                              "--memory-budget", str(budget), "--max-context", "1024"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen_peak = 0
    while child.poll() is None:
        seen_peak = max(seen_peak, vm_hwm_bytes(child.pid) or 0)
        time.sleep(0.005)
    stdout, stderr = child.communicate()
    assert child.returncode == 0, stderr
    reported = json.loads(stdout)["stats"]["peak_memory_bytes"]
    # After reading its own peak the child still serializes and prints the JSON and exits, which can
    # touch a few more pages (8 KiB seen once; one transparent huge page is 2 MiB where they are always on): an
    # observer may see that much more, never a model's worth
    after_the_report = 4 * 2**20
    assert seen_peak > 100 * 2**20 and seen_peak - after_the_report <= reported <= budget


def test_a_budget_below_even_a_short_context_says_so_and_that_need_plans():
    """Where no --max-context would fit, the refusal does not suggest one: it names what 512 tokens need."""
    import math
    import re

    refused = run_cli("generate", "--target", "smollm2-135m-instruct", "--draft", "none", "--memory-budget",
                      "100MiB", "--prompt", "hi")
    assert_one_line_error(refused, "even --max-context 512 needs", "choose a smaller model")
    assert "lower --max-context" not in refused.stderr
    need_mib = float(re.search(r"needs ([\d.]+) MiB", refused.stderr).group(1))
    planned = run_cli("plan", "--target", "smollm2-135m-instruct", "--draft", "none", "--max-context", "512",
                      "--memory-budget", f"{math.ceil(need_mib)}MiB")
    assert planned.returncode == 0, planned.stderr


def test_a_budget_that_fits_only_a_quantized_target_kv_is_refused_and_names_the_flag():
    from dataclasses import replace

    from memplanner.planner import Workload, min_budget_any
    from memplanner.shapes import shape_from_gguf
    from pocketspec.models.catalog import model_path

    shape, workload = shape_from_gguf(model_path("smollm2-135m-instruct")), Workload(max_context=8192)
    budget = min_budget_any(shape, replace(workload, target_kv_type="q8_0"))
    flags = ["--target", "smollm2-135m-instruct", "--draft", "none", "--max-context", "8192",
             "--memory-budget", str(budget)]
    refused = run_cli("generate", *flags, "--prompt", "hi")
    assert_one_line_error(refused, "is below the minimum", "--kv-type q8_0 would fit")
    planned = run_cli("plan", *flags, "--kv-type", "q8_0")
    assert planned.returncode == 0 and "target KV q8_0" in planned.stdout


def test_the_plan_keeps_the_users_kv_type_and_quantizes_only_the_draft(qwen_target_path, qwen_draft_path):
    """Headers only: at budgets that squeeze the draft, its KV type is lowered and reaches its settings."""
    from pocketspec.budget.llama_plan import apply_plan
    from memplanner.planner import Workload, plan
    from memplanner.shapes import shape_from_gguf
    from pocketspec.loader import ModelChoice
    from pocketspec.settings import ModelSettings, SpeculationSettings, draft_settings_for

    choice = ModelChoice(qwen_target_path, qwen_draft_path, "auto")
    full = plan(1 << 40, shape_from_gguf(qwen_target_path), shape_from_gguf(qwen_draft_path), Workload(4096),
                alpha=0.95).predicted_peak_bytes
    draft_kv_types = set()
    for budget in range(full, full - 300 * 2**20, -5 * 2**20):
        applied = apply_plan(choice, budget, ModelSettings(max_context=4096, kv_type="q8_0"),
                             SpeculationSettings(expected_acceptance=0.95), 64, 0.0)
        assert applied.target_settings.kv_type == applied.planner_result.settings.target_kv_type == "q8_0"
        draft_kv_type = applied.speculation.draft_kv_type
        assert draft_kv_type == applied.planner_result.settings.draft_kv_type
        assert draft_settings_for(applied.target_settings, applied.draft_max_context,
                                  draft_kv_type=draft_kv_type).kv_type == draft_kv_type
        draft_kv_types.add(draft_kv_type if applied.planner_result.settings.drafter == "model" else None)
    assert {"f16", "q8_0"} <= draft_kv_types


def test_a_draft_the_user_named_is_loaded_under_a_budget_where_it_does_not_pay(qwen_target_path, qwen_draft_path):
    """`--draft NAME --memory-budget B`: the plan loads the named draft model however little it pays (here at 5 %
    acceptance), as the loader does without a budget; a pair's own draft gives way to n-gram drafting. A budget
    too small for the named draft is refused, naming --draft ngram. Headers only: nothing loads."""
    from memplanner.device import DeviceInfo
    from pocketspec.budget.llama_plan import apply_plan
    from pocketspec.errors import UserError
    from pocketspec.loader import ModelChoice
    from pocketspec.settings import ModelSettings, SpeculationSettings

    described = DeviceInfo("cpu", "described CPU", 64 * 2**30, 64 * 2**30)
    settings, poor_draft = ModelSettings(max_context=4096), SpeculationSettings(expected_acceptance=0.05)

    def planned(is_explicit: bool, budget: int = 3 * 2**30, speculation=poor_draft):
        choice = ModelChoice(qwen_target_path, qwen_draft_path, "auto", is_explicit)
        return apply_plan(choice, budget, settings, speculation, 64, 0.0, device=described)

    named, paired = planned(True), planned(False)
    assert named.planner_result.settings.drafter == "model" and named.choice.draft_path == qwen_draft_path
    assert named.choice.draft_is_explicit and named.draft_max_context > 0
    assert paired.planner_result.settings.drafter == "ngram" and paired.choice.draft_path is None
    assert "does not pay" in paired.planner_result.reason and not named.planner_result.reason
    # settings whose drafter is `model` ask for the draft model as --draft NAME does; `ngram` does not
    ngram = planned(True, speculation=SpeculationSettings(drafter="ngram", expected_acceptance=0.05))
    assert ngram.planner_result.settings.drafter == "ngram" and ngram.choice.draft_path is None
    asked = planned(False, speculation=SpeculationSettings(drafter="model", expected_acceptance=0.05))
    assert asked.planner_result.settings.drafter == "model" and asked.choice.draft_path == qwen_draft_path

    smallest_with_draft = named.planner_result.min_budget_any_bytes
    assert named.planner_result.min_budget_loads_draft and not paired.planner_result.min_budget_loads_draft
    assert paired.planner_result.min_budget_any_bytes < smallest_with_draft
    assert planned(True, smallest_with_draft).planner_result.settings.drafter == "model"
    with pytest.raises(UserError, match="with the draft model loaded.*or pass --draft ngram$"):
        planned(True, smallest_with_draft - 1)
    assert planned(False, smallest_with_draft - 1).planner_result.settings.drafter != "model"


def test_one_named_gpu_is_planned_as_that_gpu_with_its_own_free_memory(smollm2_path):
    """`--devices cuda:1 --memory-budget 6GiB` offloads every block, so the plan is a GPU plan for GPU 1,
    budgeted by what that GPU (here a described one) has free; it used to be a CPU plan."""
    from pocketspec.budget.llama_plan import apply_plan, planned_device_name
    from memplanner import constants
    from memplanner.device import DeviceInfo
    from pocketspec.loader import ModelChoice
    from pocketspec.settings import ModelSettings, SpeculationSettings

    settings = ModelSettings(devices=("cuda:1",), max_context=1024)
    assert planned_device_name(settings) == "cuda:1"
    assert planned_device_name(ModelSettings(gpu_layers=-1)) == "cuda:0" and planned_device_name(ModelSettings()) == "cpu"
    described = DeviceInfo("cuda", "cuda:1 (described)", 8 * 2**30, 700 * 2**20)
    applied = apply_plan(ModelChoice(smollm2_path, None, "ngram"), 6 * 2**30, settings, SpeculationSettings(), 64, 0.0,
                         device=described)
    assert applied.planner_result.settings.target_device == "cuda" and applied.budget_bytes == 700 * 2**20
    assert applied.planner_result.terms["runtime_overhead"] == constants.ESTIMATED_CUDA_OVERHEAD_BYTES
    assert "target_repacked_weights" not in applied.planner_result.terms
    assert any("700.00 MiB free now" in note for note in applied.lines)


def test_a_gpu_this_process_cannot_read_is_planned_for_the_whole_budget(smollm2_path):
    from pocketspec.budget.llama_plan import apply_plan
    from pocketspec.loader import ModelChoice
    from pocketspec.settings import ModelSettings, SpeculationSettings

    applied = apply_plan(ModelChoice(smollm2_path, None, "ngram"), 3 * 2**30, ModelSettings(devices=("cuda:7",)),
                         SpeculationSettings(), 64, 0.0)
    assert applied.planner_result.settings.target_device == "cuda" and applied.budget_bytes == 3 * 2**30
    assert any("cannot read cuda:7's free memory" in note for note in applied.lines)
