"""`pocketspec plan`: the JSON contract and one-line errors with exit code 2 (reads GGUF headers only)."""

import json

import pytest
from click.testing import CliRunner

from apps.cli import main
from conftest import SESSION_HOME

MODELS = SESSION_HOME / "models"  # where `make test` pulled them
SMOLLM2 = MODELS / "smollm2-135m-instruct.gguf"
QWEN_PAIR = [MODELS / "qwen2.5-coder-1.5b-instruct.gguf", MODELS / "qwen2.5-coder-0.5b-instruct.gguf"]
needs_smollm2 = pytest.mark.usefixtures("smollm2_path")  # which fails, saying how to pull it, where it is absent
needs_qwen = pytest.mark.usefixtures("qwen_target_path", "qwen_draft_path")
KEYS = {"feasible", "predicted_peak_bytes", "terms", "settings", "min_budget_any_bytes", "min_budget_keep_bytes",
        "predicted_tokens_per_second", "degradations", "budget_bytes"}


def run(*args):
    return CliRunner().invoke(main, ["plan", *args])


@needs_smollm2
def test_json_has_the_contract_keys():
    result = run("--target", str(SMOLLM2), "--draft", "ngram", "--memory-budget", "1GiB",
                 "--max-context", "2048", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert KEYS <= set(found)
    assert found["feasible"] is True and found["budget_bytes"] == 2**30
    assert found["predicted_peak_bytes"] == sum(found["terms"].values()) <= 2**30
    assert found["min_budget_any_bytes"] <= found["min_budget_keep_bytes"] <= found["predicted_peak_bytes"]
    assert found["settings"]["drafter"] in ("ngram", "none")


@needs_smollm2
def test_draft_none_plans_plain_decoding_as_a_table():
    result = run("--target", "smollm2-135m-instruct", "--draft", "none", "--memory-budget", "512MiB")
    assert result.exit_code == 0, result.output
    assert "target_kv_cache" in result.output and "drafter none" in result.output
    assert "predicted peak" in result.output and "minimum to run at all" in result.output


@needs_smollm2
@pytest.mark.parametrize("max_context", ["512", "2048", "3000"])
def test_the_minimum_plan_prints_is_a_budget_it_accepts(max_context):
    """The figure is rounded up: typed back as --memory-budget it runs, and the smallest plan fits it."""
    shown = run("--target", str(SMOLLM2), "--max-context", max_context)
    assert shown.exit_code == 0, shown.output
    minimum = shown.output.split("minimum to run at all: ")[1].split(" (")[0]
    again = run("--target", str(SMOLLM2), "--max-context", max_context, "--memory-budget", minimum.replace(" ", ""),
                "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["predicted_peak_bytes"] <= json.loads(again.output)["budget_bytes"]


@needs_qwen
def test_pair_preset_prints_terms_for_both_models(tmp_path, monkeypatch):
    # a home with the models but no measured costs: speed comes from the reference tables, where
    # the draft model pays at α 0.95 (this machine's own table may say it does not)
    (tmp_path / "models").symlink_to(MODELS)
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    result = run("--pair", "qwen-coder", "--memory-budget", "3GiB", "--max-context", "4096", "--alpha", "0.95",
                 "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["settings"]["drafter"] == "model" and "draft_kv_cache" in found["terms"]


@needs_smollm2
@pytest.mark.parametrize("budget, message, draft", [
    ("3X", "cannot read '3X' as a size", "none"),
    ("10MiB", "is below the minimum", "none"),
    ("1GiB", "--draft self-sparse drafts with the target's own weights and needs --backend torch", "self-sparse"),
])
def test_what_cannot_be_planned_is_one_line_with_exit_code_2(budget, message, draft):
    result = run("--target", str(SMOLLM2), "--draft", draft, "--memory-budget", budget)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in result.output


@needs_smollm2
@pytest.mark.parametrize("args, feasible", [
    (["--memory-budget", "10MiB"], False),  # a budget too small is a plan that is not feasible
    (["--memory-budget", "3X"], None),
    (["--max-tokens", "0"], None),  # refused while the flags are parsed, before --json itself is
    (["--draft", str(MODELS / "absent.gguf")], None),
])
def test_a_json_refusal_is_one_json_object_on_stdout(args, feasible):
    """`plan --json` printed the plan as JSON, and a refusal as a line on stderr only: a script read nothing on
    stdout. The line stays on stderr for a person, and the exit code is 2."""
    result = run("--target", str(SMOLLM2), *args, "--json")
    assert result.exit_code == 2
    found = json.loads(result.stdout)
    line = result.stderr.strip()
    assert line.startswith("error: ") and found["error"] == line.removeprefix("error: ")
    assert found.get("feasible") is feasible


@needs_qwen
@pytest.mark.parametrize("memory_budget, draft, options", [
    ("3GiB", None, {}),
    ("1400MiB", None, {"max_gamma": 4}),
    ("1300MiB", "ngram", {}),
    ("2GiB", "none", {}),
])
def test_plan_previews_the_plan_that_generate_runs(memory_budget, draft, options):
    """`pocketspec plan` and a session's planning, on the same settings, give the same plan: one resolution of
    the flags, one split test, one workload and one planner call."""
    from pocketspec.budget import apply_budget
    from pocketspec.budget.preview import preview_plan
    from pocketspec.session_settings import SessionSettings, repack_allowed, settings_for

    settings = SessionSettings(pair="qwen-coder", draft=draft, memory_budget=memory_budget, max_context=2048,
                               max_new_tokens=256, options=options)
    previewed = preview_plan(settings)
    choice, target_settings, speculation = settings_for(settings)
    applied = apply_budget(choice, settings.budget, target_settings, speculation, max_new_tokens=256,
                           temperature=settings.sampling.temperature, repack=repack_allowed(settings.repack))
    assert previewed.result.to_dict() == applied.planner_result.to_dict()
