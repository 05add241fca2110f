"""memplanner.split: per-device budgets, the layer split, draft placement, refusals and `plan --devices`."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from apps.cli import main
from memplanner.planner import Workload, plan
from memplanner.shapes import ModelShape
from memplanner.split import DeviceBudget, parse_device_budgets, plan_split

GIB, MIB = 2**30, 2**20
BLOCKS = tuple([29_990_912, 26_341_376] * 14)  # Q4_K_M gives half the blocks a Q6_K feed-forward
TARGET = ModelShape("qwen2.5-coder-1.5b", "qwen2", 28, 1536, 12, 2, 128, 151936, 1_111_370_240,
                    1_117_320_768, 32768, 8960, 625_508_352, 131_272_704, 191_445_504, BLOCKS)
DRAFT = ModelShape("qwen2.5-coder-0.5b", "qwen2", 24, 896, 14, 2, 64, 151936, 485_452_288,
                   491_400_064, 32768, 4864, 29_417_472, 93_592_576, 144_646_656)
WORKLOAD = Workload(max_context=4096)
GOOD_DRAFT = 0.95


def test_budget_forms_and_their_errors():
    assert parse_device_budgets("cuda:0,cuda:1", "6GiB,4GiB") == [DeviceBudget("cuda:0", 6 * GIB),
                                                                 DeviceBudget("cuda:1", 4 * GIB)]
    assert parse_device_budgets(None, "cuda:0=6GiB, rocm:1=512MiB") == [DeviceBudget("cuda:0", 6 * GIB),
                                                                       DeviceBudget("rocm:1", 512 * MIB)]
    assert [d.budget_bytes for d in parse_device_budgets("cuda:0,cuda:1", "3G")] == [3 * GIB, 3 * GIB]
    assert parse_device_budgets("cpu:0,cpu:1", "1GiB")[1].kind == "cpu"
    assert parse_device_budgets(None, "rocm:0=1GiB")[0].kind == "cuda"
    for devices, budgets, message in [("cuda:0,cuda:1", "1GiB,2GiB,3GiB", "2 devices"),
                                      ("tpu:0", "1GiB", "not one of"), ("cuda:0", "0", "must be positive"),
                                      ("cuda:0,cuda:0", "1GiB", "listed twice"), (None, "cuda:0=1GiB,2GiB", "mixes"),
                                      ("cuda:1", "cuda:0=1GiB", "differ"), ("cuda:0", "lots", "cannot read"),
                                      ("cuda:0,,cuda:1", "1GiB", "an entry is empty")]:
        with pytest.raises(ValueError, match=message):
            parse_device_budgets(devices, budgets)


def test_one_cpu_device_is_the_single_device_plan():
    for budget in (int(1.3 * GIB), 2 * GIB, 3 * GIB):
        single = plan(budget, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
        split = plan_split([DeviceBudget("cpu", budget)], TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
        assert split.settings == single.settings
        assert split.shares[0].peak_bytes == single.predicted_peak_bytes


def test_blocks_cover_the_model_once_and_every_device_stays_in_budget():
    devices = parse_device_budgets("cuda:0,cuda:1,cuda:2", "1GiB,1.2GiB,1GiB")
    result = plan_split(devices, TARGET, DRAFT, WORKLOAD)
    assert result.feasible
    first = 0
    for share in result.shares:
        assert share.first_layer == first and share.peak_bytes <= share.budget_bytes
        first += share.num_layers
    assert first == TARGET.num_layers
    assert sum(share.terms["target_blocks"] for share in result.shares) == sum(BLOCKS)
    assert "output_head" in result.shares[-1].terms
    assert sum(result.tensor_split) == pytest.approx(1.0)
    # the middle device holds neither embeddings nor head, so it takes the most blocks
    assert result.shares[1].num_layers == max(share.num_layers for share in result.shares)


def test_token_embeddings_stay_in_host_memory():
    """llama.cpp never offloads token_embd: a GPU-only split charges it to the host, not to cuda:0."""
    gpus = plan_split(parse_device_budgets("cuda:0,cuda:1", "1.5GiB"), TARGET, None, WORKLOAD)
    assert gpus.feasible, gpus.reason
    assert all("embeddings" not in share.terms for share in gpus.shares)
    assert gpus.host_terms["embeddings"] == TARGET.embedding_bytes
    mixed = plan_split(parse_device_budgets("cpu:0,cuda:0", "2GiB,1GiB"), TARGET, None, WORKLOAD)
    assert mixed.shares[0].terms["embeddings"] == TARGET.embedding_bytes and mixed.host_terms == {}


def test_a_tied_head_is_copied_onto_the_last_gpu():
    """llama.cpp loads a tied output head (token_embd, TENSOR_DUPLICATED) into the output device's buffer."""
    tied = replace(TARGET, tied_output=True)
    on_gpus = plan_split(parse_device_budgets("cuda:0,cuda:1", "1.5GiB"), tied, None, WORKLOAD)
    assert on_gpus.shares[-1].terms["output_head"] == TARGET.output_bytes + TARGET.embedding_bytes
    on_cpus = plan_split(parse_device_budgets("cpu:0,cpu:1", "1.5GiB"), tied, None, WORKLOAD)
    assert on_cpus.shares[-1].terms["output_head"] == TARGET.output_bytes


def test_gpus_given_out_of_order_are_planned_in_the_order_llama_cpp_runs_them():
    result = plan_split(parse_device_budgets("cuda:1,cpu:0,cuda:0", "1GiB,1.5GiB,2GiB"), TARGET, None, WORKLOAD)
    assert [(share.device, share.budget_bytes) for share in result.shares] == [
        ("cpu:0", int(1.5 * GIB)), ("cuda:0", 2 * GIB), ("cuda:1", 1 * GIB)]
    assert "output_head" in result.shares[-1].terms


def test_layers_follow_the_room_each_budget_leaves():
    even = plan_split(parse_device_budgets("cuda:0,cuda:1", "2GiB"), TARGET, None, WORKLOAD)
    assert abs(even.shares[0].num_layers - even.shares[1].num_layers) <= 4
    uneven = plan_split(parse_device_budgets("cuda:0,cuda:1", "3GiB,1.2GiB"), TARGET, None, WORKLOAD)
    assert uneven.shares[0].num_layers > uneven.shares[1].num_layers > 0


def test_the_draft_goes_where_it_fits_best_or_gives_way_to_ngram():
    roomy_second = plan_split(parse_device_budgets("cuda:0,cuda:1", "1.3GiB,2.5GiB"), TARGET, DRAFT, WORKLOAD,
                              alpha=GOOD_DRAFT)
    assert roomy_second.settings.drafter == "model" and roomy_second.draft_device == "cuda:1"
    assert "draft_weights" in roomy_second.shares[1].terms and "draft_weights" not in roomy_second.shares[0].terms
    tight = plan_split(parse_device_budgets("cuda:0,cuda:1", "1.1GiB"), TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
    assert tight.feasible and tight.settings.drafter != "model" and tight.draft_device is None
    assert any("instead of the draft model" in step for step in tight.degradations)


def test_more_budget_on_one_device_never_gives_a_slower_plan():
    previous = 0.0
    for extra in range(0, 2048, 64):
        devices = [DeviceBudget("cuda:0", 1120 * MIB + extra * MIB), DeviceBudget("cuda:1", 1120 * MIB)]
        result = plan_split(devices, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
        assert result.feasible and result.predicted_tokens_per_second >= previous - 1e-12
        previous = result.predicted_tokens_per_second


def test_a_target_that_cannot_fit_is_refused_in_one_line():
    result = plan_split(parse_device_budgets("cuda:0,cuda:1", "700MiB"), TARGET, DRAFT, WORKLOAD)
    assert not result.feasible and "\n" not in result.reason
    assert result.reason.startswith("qwen2.5-coder-1.5b does not fit across cuda:0 700.00 MiB, cuda:1 700.00 MiB")


def test_cli_plans_devices_this_machine_does_not_have(smollm2_path):
    runner = CliRunner()
    shown = runner.invoke(main, ["plan", "--target", str(smollm2_path), "--draft", "ngram", "--devices",
                                 "cuda:0,cuda:1", "--memory-budget", "700MiB,600MiB"])
    assert shown.exit_code == 0, shown.output
    assert "cuda:0: target blocks 0-" in shown.output and "tensor split:" in shown.output
    assert "speed predicted from: reference tables" in shown.output  # devices not here: nothing measured them
    as_json = json.loads(runner.invoke(main, ["plan", "--target", str(smollm2_path), "--memory-budget",
                                              "cuda:0=700MiB,cuda:1=600MiB", "--json"]).output)
    assert as_json["feasible"] and set(as_json["predicted_peak_bytes"]) == {"cuda:0", "cuda:1"}
    refused = runner.invoke(main, ["plan", "--target", str(smollm2_path), "--devices", "cuda:0,cuda:1",
                                   "--memory-budget", "100MiB"])
    assert refused.exit_code == 2 and "does not fit across" in refused.output


@pytest.mark.parametrize("weights, kv_dtype, advice", [
    ("fp32", "fp32", "try --weights int8 or int4, a smaller --max-context, or --torch-kv-type int8"),
    ("int8", "int8", "try --weights int4 or a smaller --max-context"),
    ("int4", "bf16", "try a smaller --max-context or --torch-kv-type int8"),
    ("int4", "int8", "try a smaller --max-context"),
])
def test_a_refusal_offers_only_what_the_settings_do_not_already_have(weights, kv_dtype, advice):
    from memplanner.torch_sizes import lighter_torch_settings

    assert lighter_torch_settings(weights, kv_dtype) == advice
