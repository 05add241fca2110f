"""`--backend torch` from the command line: generation with each drafter, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from test_cli_errors import assert_one_line_error, run_cli
from tiny_models import write_tiny_pair


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return str(write_tiny_pair(tmp_path_factory.mktemp("tiny_cli"), quant=None)[0])


def _generate(*args: str):
    return run_cli("generate", "--prompt", "the cat is", "--max-tokens", "24", "--json", "--threads", "1", *args)


def test_self_sparse_from_the_cli_equals_plain(tiny_target):
    plain = _generate("--target", tiny_target, "--draft", "none", "--backend", "torch")
    sparse = _generate("--target", tiny_target, "--draft", "self-sparse", "--backend", "torch", "--gamma", "3",
                       "--self-draft-window", "80", "--self-draft-kv-type", "int8", "--memory-budget", "400MiB")
    assert plain.returncode == 0 and sparse.returncode == 0, sparse.stderr
    assert json.loads(sparse.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    assert json.loads(sparse.stdout)["stats"]["num_drafted"] > 0
    assert "memory plan (torch)" in sparse.stderr and "self-sparse KV" in sparse.stderr


def test_the_summary_line_says_nothing_was_drafted_rather_than_an_acceptance_of_zero(tiny_target):
    plain = run_cli("generate", "--prompt", "the cat is", "--max-tokens", "8", "--threads", "1", "--target",
                    tiny_target, "--draft", "none", "--backend", "torch")
    drafted = run_cli("generate", "--prompt", "the cat is the cat is the cat is", "--max-tokens", "24", "--threads",
                      "1", "--target", tiny_target, "--draft", "ngram", "--gamma", "3", "--backend", "torch")
    assert plain.returncode == 0 and drafted.returncode == 0, drafted.stderr
    assert "nothing drafted" in plain.stderr and "acceptance" not in plain.stderr
    assert "accepted/step" in drafted.stderr and "nothing drafted" not in drafted.stderr


@pytest.mark.parametrize("weights", ["int8", "int4", "bf16"])
def test_weight_formats_generate(tiny_target, weights):
    result = _generate("--target", tiny_target, "--draft", "ngram", "--backend", "torch", "--weights", weights)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["tokens"]) == 24


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error shown where torch sees no GPU")
def test_cuda_without_a_gpu_is_a_user_error(tiny_target):
    result = _generate("--target", tiny_target, "--backend", "torch", "--device", "cuda:1")
    assert_one_line_error(result, "--device cuda:1", "sees no GPU")


@pytest.mark.parametrize("args, fragments", [
    (["--draft", "self-sparse"], ["--draft self-sparse", "--backend torch"]),
    (["--weights", "int8"], ["--weights", "--backend torch"]),
    (["--backend", "torch", "--device", "tpu"], ["--device 'tpu'"]),
    (["--backend", "torch", "--draft", "self-sparse", "--self-draft-window", "40"], ["window 40 is too small"]),
    (["--backend", "torch", "--memory-budget", "100KiB"], ["below the torch backend's predicted peak", "weights"]),
    # a self-draft flag no drafter reads is refused, not ignored
    (["--backend", "torch", "--draft", "ngram", "--self-draft-window", "64"], ["--self-draft-window applies to --draft "
                                                                             "self-sparse"]),
    (["--backend", "torch", "--draft", "self-sparse", "--self-skip-layers", "1"], ["--self-skip-layers applies to "
                                                                                 "--draft self-skip"]),
    (["--self-draft-keys", "attended"], ["--self-draft-keys applies to --draft self-sparse"]),
])
def test_bad_torch_flags_are_one_line_errors(tiny_target, args, fragments):
    assert_one_line_error(_generate("--target", tiny_target, *args), *fragments)


def test_a_budget_below_every_setting_names_what_the_lightest_need_and_that_budget_runs(tiny_target):
    """Too small for any weights, KV type and context: the refusal names the lightest settings and their
    budget instead of lighter settings that would not fit either; given that budget, they run."""
    import math
    import re

    refused = _generate("--target", tiny_target, "--backend", "torch", "--memory-budget", "100KiB")
    assert_one_line_error(refused, "even --weights int4 --torch-kv-type int8 --max-context 512 need",
                          "raise --memory-budget")
    assert "try --weights" not in refused.stderr
    need_mib = float(re.search(r"need ([\d.]+) MiB", refused.stderr).group(1))
    lightest = ["--weights", "int4", "--torch-kv-type", "int8", "--max-context", "512"]
    fits = _generate("--target", tiny_target, "--backend", "torch", *lightest,
                     "--memory-budget", f"{math.ceil(need_mib)}MiB")
    assert fits.returncode == 0, fits.stderr
    short = _generate("--target", tiny_target, "--backend", "torch", *lightest,
                      "--memory-budget", f"{math.floor(need_mib) - 1}MiB")
    assert_one_line_error(short, "below the torch backend's predicted peak")


def test_a_budget_refused_on_the_cpu_is_refused_before_torch_loads(tiny_target):
    """torch alone is about 180 MiB resident: a refusal that imported it first would exceed the budget it refuses."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from pocketspec.errors import UserError\n"
            "from pocketspec.session import open_session\n"
            "from pocketspec.session_settings import SessionSettings\n"
            f"settings = SessionSettings(target={tiny_target!r}, draft='none', memory_budget='100MiB', "
            "options={'backend': 'torch'})\n"
            "try:\n"
            "    open_session(settings)\n"
            "except UserError as error:\n"
            "    print('refused', 'torch' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "refused False", run.stdout + run.stderr


@pytest.mark.gpu
def test_cuda_generation_equals_its_own_plain_decoding(tiny_target):
    if not torch.cuda.is_available():
        pytest.skip("no GPU visible to torch")
    plain = _generate("--target", tiny_target, "--draft", "none", "--backend", "torch", "--device", "cuda")
    sparse = _generate("--target", tiny_target, "--draft", "self-sparse", "--backend", "torch", "--device", "cuda",
                       "--weights", "fp32", "--gamma", "3", "--self-draft-window", "80")
    assert plain.returncode == 0 and sparse.returncode == 0, sparse.stderr
    assert len(json.loads(sparse.stdout)["tokens"]) == 24
