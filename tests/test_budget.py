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
