"""Sizing the batch and the pool rows within a budget: pure arithmetic, checked against what the
batched model really allocates."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from memplanner.batch_rows import BatchWorkload, forward_bytes_per_sequence, kv_dtype_for, plan_batch
from memplanner.gpu_terms import TORCH_CUDA_CONTEXT_BYTES
from memplanner.shapes import shape_from_gguf
from memplanner.sizes import format_bytes
from memplanner.torch_peak import CPU_HEAP_RESERVE_BYTES
from memplanner.torch_sizes import gguf_layout, torch_kv_bytes, torch_weight_bytes
from tiny_models import write_tiny_pair

WORKLOAD = BatchWorkload(max_context=256, max_batch=8, num_rows=12, max_gamma=4, key_block=128)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_pair(tmp_path_factory.mktemp("tiny_rows"), quant=None)[0]
    return path, shape_from_gguf(path), gguf_layout(path)[0]


def _plan(tiny, usable_bytes: int, workload: BatchWorkload = WORKLOAD, **draft):
    """The plan for a CPU budget that leaves usable_bytes beside the heap reserve it keeps free."""
    _, shape, is_tied = tiny
    return plan_batch(shape, workload, budget_bytes=usable_bytes + CPU_HEAP_RESERVE_BYTES, weights_format="fp32",
                      kv_dtype="fp32", is_tied=is_tied, **draft)


def test_a_cpu_budget_keeps_the_heap_reserve_free_and_a_gpu_budget_does_not(tiny):
    _, shape, is_tied = tiny
    one = replace(WORKLOAD, max_batch=1, num_rows=1)
    least = _plan(tiny, 1 << 30, one).total_bytes
    assert not plan_batch(shape, one, budget_bytes=least + CPU_HEAP_RESERVE_BYTES - 1, weights_format="fp32",
                          kv_dtype="fp32", is_tied=is_tied).feasible
    gpu = plan_batch(shape, one, budget_bytes=1 << 30, weights_format="fp32", kv_dtype="fp32", is_tied=is_tied,
                     on_gpu=True)
    assert plan_batch(shape, one, budget_bytes=gpu.total_bytes, weights_format="fp32", kv_dtype="fp32",
                      is_tied=is_tied, on_gpu=True).feasible
    assert gpu.terms["cuda context"] == TORCH_CUDA_CONTEXT_BYTES  # what the device gives beside the allocator


def test_an_ample_budget_gets_every_row_and_the_whole_batch(tiny):
    plan = _plan(tiny, 1 << 30)
    assert plan.feasible and (plan.num_rows, plan.max_batch) == (12, 8) and plan.notes == ()
    _, shape, _ = tiny
    assert plan.terms["target KV × 12 rows"] == torch_kv_bytes(shape, "fp32", 256, max_batch=12)


def test_a_tighter_budget_lowers_rows_then_the_batch_and_stays_inside(tiny):
    # a long context, so the KV rows outweigh the loading moment (the GGUF mapped, a chunk staged)
    long = replace(WORKLOAD, max_context=16384)
    generous = _plan(tiny, 1 << 30, long)
    one = _plan(tiny, 1 << 30, replace(long, max_batch=1, num_rows=1))
    assert generous.terms["loading_excess"] == 0
    for budget in (generous.total_bytes - 1, (generous.total_bytes + one.total_bytes) // 2, one.total_bytes + 1):
        plan = _plan(tiny, budget, long)
        assert plan.feasible and plan.total_bytes <= budget
        assert 1 <= plan.max_batch <= plan.num_rows < 12 and plan.notes
    fewer_rows = _plan(tiny, generous.total_bytes - 1, long)
    assert fewer_rows.max_batch == 8 and fewer_rows.num_rows == 11


def test_the_loading_moment_is_a_floor_no_smaller_batch_goes_below(tiny):
    _, shape, _ = tiny
    generous = _plan(tiny, 1 << 30)  # a tiny model at 256 tokens: loading outweighs every KV row
    assert generous.terms["loading_excess"] > 0
    assert not _plan(tiny, generous.total_bytes - 1).feasible


def test_a_budget_below_one_sequence_is_refused_with_the_terms(tiny):
    one = _plan(tiny, 1 << 30, replace(WORKLOAD, max_batch=1, num_rows=1))
    assert _plan(tiny, one.total_bytes).feasible
    plan = _plan(tiny, one.total_bytes - 1)
    assert not plan.feasible and "cannot hold even one sequence" in plan.reason and "target KV" in plan.reason
    # the need it names, with what it keeps free, is the budget that fits (one more byte than the one refused)
    assert f"{format_bytes(one.total_bytes)} + {format_bytes(CPU_HEAP_RESERVE_BYTES)} kept free)" in plan.reason


def test_drafts_add_their_rows_and_weights(tiny):
    _, shape, is_tied = tiny
    self_skip = _plan(tiny, 1 << 30, draft_layers=1)
    assert self_skip.terms["self-skip KV × 12 rows"] == torch_kv_bytes(shape, "fp32", 256, num_layers=1, max_batch=12)
    with_model = _plan(tiny, 1 << 30, draft_shape=shape, draft_is_tied=is_tied)
    assert with_model.terms["draft weights"] == torch_weight_bytes(shape, "fp32", is_tied=is_tied)


def test_the_planned_kv_rows_are_what_the_batched_model_allocates(tiny):
    from pocketspec.batch.batched_model import BatchedModel
    from pocketspec.settings import BatchSettings
    from pocketspec.torch_model.load import load_model

    path, shape, _ = tiny
    plan = _plan(tiny, 1 << 30)
    model = load_model(path, "fp32", torch.device("cpu"))
    batched = BatchedModel(model, num_rows=plan.num_rows, max_context=256, kv_dtype="fp32", n_batch=64,
                           settings=BatchSettings(is_batch_invariant=False))
    assert batched.cache.num_bytes == plan.terms["target KV × 12 rows"]
    assert batched.memory_report()["weights"] == plan.terms["weights"]


def test_activations_grow_with_the_context_and_the_verify_width(tiny):
    _, shape, _ = tiny
    small = forward_bytes_per_sequence(shape, WORKLOAD, "fp32")
    assert forward_bytes_per_sequence(shape, replace(WORKLOAD, max_context=1024), "fp32") > small
    assert forward_bytes_per_sequence(shape, replace(WORKLOAD, max_gamma=8), "fp32") > small


@pytest.mark.parametrize("kv_dtype, weights, on_gpu, expected", [
    ("auto", "fp32", False, "fp32"), ("auto", "int8", False, "fp32"), ("auto", "int8", True, "bf16"),
    ("auto", "fp16", True, "fp16"), ("int8", "fp32", False, "int8")])
def test_auto_kv_dtype(kv_dtype, weights, on_gpu, expected):
    assert kv_dtype_for(kv_dtype, weights, on_gpu) == expected
