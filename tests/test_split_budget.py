"""`generate --devices ... --memory-budget a,b` from the command line: each backend loads the plan's
split and generates what one device generates (torch layer and row split, the row split spawned
and under torchrun; llama.cpp with a draft), and what cannot run is one clear line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_errors import assert_one_line_error, run_cli
from tiny_models import write_tiny_pair

TORCH = ["--backend", "torch", "--threads", "1"]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """F32 for torch; llama.cpp runs the same files."""
    return [str(path) for path in write_tiny_pair(tmp_path_factory.mktemp("split_cli"), quant=None, num_layers=4)]


def _generate(target: str, *args: str, runner=run_cli):
    threads = [] if "--threads" in args else ["--threads", "1"]
    return runner("generate", "--prompt", "the cat is", "--max-tokens", "32", "--json", "--max-context", "256",
                  "--target", target, *threads, *args)


def _tokens(result) -> list[int]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["tokens"]


@pytest.fixture(scope="module")
def torch_plain(tiny_pair):
    return _tokens(_generate(tiny_pair[0], "--draft", "none", *TORCH))


def test_torch_layer_split_from_per_device_budgets(tiny_pair, torch_plain):
    # cpu:0 holds the process too (torch, the interpreter, the tokenizer: 261.8 MiB of this plan's): 262 MiB leaves
    # it room for one block; a budget that left the process out had a 960 MiB run planned in 840 MiB
    result = _generate(tiny_pair[0], "--draft", "ngram", "--gamma", "3", *TORCH, "--devices", "cpu:0,cpu:1",
                       "--memory-budget", "262MiB,1MiB")
    assert _tokens(result) == torch_plain
    assert "memory plan cpu:0: target blocks 0-0;" in result.stderr and "torch_runtime" in result.stderr
    assert "memory plan cpu:1: target blocks 1-3;" in result.stderr
    _assert_plan_shows(result.stderr, tiny_pair[0], "--draft", "ngram", "--backend", "torch", "--devices",
                       "cpu:0,cpu:1", "--memory-budget", "262MiB,1MiB")


def _assert_plan_shows(generate_stderr: str, target: str, *flags: str) -> None:
    """`pocketspec plan` with generate's flags shows each device's blocks and peak as generate's notes did."""
    planned = run_cli("plan", "--target", target, "--max-context", "256", *flags)
    assert planned.returncode == 0, planned.stderr
    notes = re.findall(r"memory plan (cpu:\d): (target blocks [\d-]+|a slice).*= ([\d.]+ \w+ of [\d.]+ \w+)",
                       generate_stderr)
    shown = re.findall(r"^(cpu:\d): (target blocks [\d-]+|a slice).*predicted peak ([\d.]+ \w+ of [\d.]+ \w+)",
                       planned.stdout, re.MULTILINE)
    assert len(notes) == 2 and [peak for *_, peak in shown] == [peak for *_, peak in notes], (shown, notes)


@pytest.mark.parametrize("args, fragments", [
    (["--backend", "torch", "--devices", "cpu:0,cpu:1", "--memory-budget", "1GiB,1GiB", "--alpha", "0.5"],
     ["--alpha does not change a torch split's plan"]),
    (["--memory-budget", "1GiB", "--split-mode", "row"], ["--split-mode applies to a torch target split"]),
    (["--backend", "torch", "--devices", "cpu:0,cpu:1", "--memory-budget", "1GiB,1GiB", "--split-mode", "row",
      "--draft", "self-sparse"], ["--draft self-sparse runs the target's own layers", "--split-mode row"]),
])
def test_a_plan_refuses_what_a_torch_split_does_not_read(tiny_pair, args, fragments):
    assert_one_line_error(run_cli("plan", "--target", tiny_pair[0], "--max-context", "256", *args), *fragments)


def test_a_layer_split_plans_a_self_draft_as_generate_runs_it(tiny_pair):
    planned = run_cli("plan", "--target", tiny_pair[0], "--max-context", "256", "--backend", "torch", "--devices",
                      "cpu:0,cpu:1", "--memory-budget", "1GiB,1GiB", "--draft", "self-sparse")
    assert planned.returncode == 0 and "(self-sparse drafting) on torch" in planned.stdout, planned.stderr


def test_torch_row_split_spawned_and_under_torchrun(tiny_pair, torch_plain):
    spawned = _generate(tiny_pair[0], "--draft", tiny_pair[1], "--gamma", "3", *TORCH, "--devices", "cpu:0,cpu:1",
                        "--split-mode", "row")
    assert _tokens(spawned) == torch_plain

    def torchrun(*args: str):
        return subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "2",
                               "-m", "apps.cli", *args], capture_output=True, text=True, timeout=300)

    launched = _generate(tiny_pair[0], "--draft", "ngram", *TORCH, "--memory-budget", "cpu:0=512MiB,cpu:1=512MiB",
                         "--split-mode", "row", runner=torchrun)
    assert _tokens(launched) == torch_plain
    assert "memory plan cpu:1: target blocks 0-3" in launched.stderr  # every rank a slice of every block
    _assert_plan_shows(launched.stderr, tiny_pair[0], "--draft", "ngram", "--backend", "torch", "--memory-budget",
                       "cpu:0=512MiB,cpu:1=512MiB", "--split-mode", "row")


def test_llama_cpp_loads_the_planned_split(tiny_pair):
    plain = _tokens(_generate(tiny_pair[0], "--draft", "none"))
    result = _generate(tiny_pair[0], "--draft", tiny_pair[1], "--gamma", "3", "--devices", "cpu:0,cpu:1",
                       "--memory-budget", "1GiB,2GiB")
    assert _tokens(result) == plain
    assert "memory plan cpu:0: target blocks 0-0;" in result.stderr  # cpu:0 also holds embeddings and host terms


@pytest.mark.real_model
def test_the_plan_puts_the_draft_model_on_its_own_device(qwen_target_path, qwen_draft_path):
    """The qwen-coder pair over two budgets (headers only, nothing loads): the draft runs whole where the
    plan put it, with llama.cpp's split mode none on that device."""
    from pocketspec.budget.split_plan import apply_split
    from pocketspec.backends.llama_split import llama_split
    from pocketspec.loader import ModelChoice
    from memplanner.memory_budget import parse_memory_budget
    from pocketspec.settings import ModelSettings, SpeculationSettings, draft_settings_for

    choice = ModelChoice(qwen_target_path, qwen_draft_path, "auto")
    applied = apply_split(choice, parse_memory_budget("cpu:0=1.2GiB,cpu:1=1.6GiB"), ModelSettings(max_context=4096),
                          SpeculationSettings(expected_acceptance=0.95), 128, 0.0)  # a draft this good pays
    assert applied.choice.draft_path == qwen_draft_path and applied.draft_device in ("cpu:0", "cpu:1")
    assert sum(applied.target_settings.layers_per_device) == 28
    assert any(note.endswith("(and the draft model)") and applied.draft_device in note for note in applied.lines)
    draft_settings = draft_settings_for(applied.target_settings, applied.draft_max_context, applied.draft_device,
                                        applied.speculation.draft_kv_type)
    assert draft_settings.devices == (applied.draft_device,) and draft_settings.layers_per_device == ()
    gpu_draft = draft_settings_for(ModelSettings(devices=("cuda:0", "cuda:1")), None, "cuda:1")
    assert llama_split(gpu_draft, 24, 16).main_gpu == 1


@pytest.mark.parametrize("args, fragments", [
    (["--devices", "cuda:0,cuda:1"], ["this llama.cpp build runs on the CPU only"]),
    (["--devices", "cpu:0,tpu:1"], ["'tpu:1' is not one of"]),
    (TORCH + ["--devices", "cpu:0,cuda:0"], ["--devices cuda:0", "sees no GPU"]),
    (TORCH + ["--devices", "cpu:0,cpu:1", "--device", "cuda"], ["not both"]),
    (TORCH + ["--devices", "cpu:0,cpu:1", "--memory-budget", "1GiB,1GiB,1GiB"], ["2 devices", "3 budgets"]),
    (TORCH + ["--devices", "cpu:0,cpu:1", "--memory-budget", "100KiB,100KiB"], ["does not fit across cpu:0"]),
    (TORCH + ["--memory-budget", "cpu:0=1GiB", "--split-mode", "row"], ["two or more --devices"]),
    (TORCH + ["--devices", "cpu:0,cpu:1", "--split-mode", "row", "--draft", "self-skip"], ["--split-mode row"]),
    (TORCH + ["--devices", "cpu:0,cpu:1,cpu:2", "--split-mode", "row"], ["at least that many key/value heads"]),
])
def test_splits_that_cannot_run_are_one_line_errors(tiny_pair, args, fragments):
    assert_one_line_error(_generate(tiny_pair[0], *args), *fragments)
