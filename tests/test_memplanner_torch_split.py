"""memplanner.torch_split: each device's planned bytes equal what the torch backend allocates there
(layer split with a self-draft's cache, row split with uneven heads), blocks follow the budgets,
and a split that cannot fit is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from memplanner.shapes import shape_from_gguf
from memplanner.split import DeviceBudget
from memplanner.torch_sizes import gguf_layout
from memplanner.gpu_terms import TORCH_CUDA_CONTEXT_BYTES
from memplanner.torch_split import TorchLayout, plan_layer_split, plan_row_split, tensor_bytes
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.backends.torch_open import open_backend, open_self_draft
from pocketspec.settings import ModelSettings, SpeculationSettings
from tiny_models import tiny_vocabulary, tiny_weights, write_tiny_model

SHAPE = dict(dim=96, num_layers=4, num_heads=6, num_kv_heads=3, ffn_dim=130)
MIB = 2**20


@pytest.fixture(scope="module")
def uneven_model(tmp_path_factory):
    """qwen2 (q/k/v biases), untied, F32; 3 KV heads and 130 columns split unevenly over 2 ranks."""
    tensors = tiny_weights(np.random.default_rng(5), len(tiny_vocabulary()[0]), has_qkv_bias=True, **SHAPE)
    return write_tiny_model(tmp_path_factory.mktemp("torch_split") / "uneven.gguf", tensors, arch="qwen2",
                            quant=None, **SHAPE)


def _layout(path, **changes) -> TorchLayout:
    is_tied, has_qkv_bias = gguf_layout(path)
    return TorchLayout(**{**dict(weights_format="fp32", kv_dtype="fp32", max_context=256, is_tied=is_tied,
                                 has_qkv_bias=has_qkv_bias), **changes})


def _devices(*budgets_mib: float) -> list[DeviceBudget]:
    return [DeviceBudget(f"cpu:{index}", int(budget * MIB)) for index, budget in enumerate(budgets_mib)]


def _allocated(*backends) -> dict[str, int]:
    found: dict[str, int] = {}
    for backend in backends:
        for device, terms in backend.memory_by_device().items():
            found[device] = found.get(device, 0) + sum(terms.values())
    return found


def test_layer_split_bytes_equal_what_each_device_allocates(uneven_model):
    shape = shape_from_gguf(uneven_model)
    layout = _layout(uneven_model, self_draft="self-sparse", draft_kv_dtype="int8", draft_window=96)
    plan = plan_layer_split(_devices(1, 4), shape, layout)
    assert plan.feasible and sum(plan.layers_per_device) == 4
    assert plan.layers_per_device[0] < plan.layers_per_device[1]  # the smaller budget takes fewer blocks
    settings = ModelSettings(backend="torch", weights="fp32", max_context=256, devices=("cpu:0", "cpu:1"),
                             layers_per_device=plan.layers_per_device)
    speculation = SpeculationSettings(self_draft_window=96, self_draft_kv_type="int8")
    with TorchBackend.open(uneven_model, settings) as target:
        draft = open_self_draft(target, "self-sparse", settings, speculation)
        assert _allocated(target, draft) == {share.device: share.peak_bytes for share in plan.shares}
        assert all(share.peak_bytes <= share.budget_bytes for share in plan.shares)


@pytest.mark.usefixtures("one_torch_thread")
def test_row_split_bytes_equal_what_each_rank_allocates(uneven_model):
    shape = shape_from_gguf(uneven_model)
    plan = plan_row_split(_devices(4, 4), shape, _layout(uneven_model))
    assert plan.feasible and plan.shares[0].peak_bytes > plan.shares[1].peak_bytes  # 2 KV groups vs 1
    settings = ModelSettings(backend="torch", weights="fp32", max_context=256, devices=("cpu:0", "cpu:1"),
                             split_mode="row", num_threads=1)
    with open_backend(uneven_model, settings) as rows:
        assert _allocated(rows) == {share.device: share.peak_bytes for share in plan.shares}


def test_splits_that_cannot_fit_are_refused(uneven_model):
    shape = shape_from_gguf(uneven_model)
    refused = plan_layer_split(_devices(0.5, 0.5), shape, _layout(uneven_model))
    assert not refused.feasible and "does not fit across cpu:0 512.00 KiB, cpu:1 512.00 KiB" in refused.reason
    assert not plan_row_split(_devices(4, 0.5), shape, _layout(uneven_model)).feasible


def test_on_cpus_the_process_is_counted_once_for_a_layer_split_and_on_every_rank_of_a_row_split(uneven_model):
    """A split on cpu:N planned its tensors only: a layer split of SmolLM2 planned in 420 MiB a device peaked at
    968 MiB, and each rank of a row split is a process of its own, with its own torch."""
    shape = shape_from_gguf(uneven_model)
    layers = plan_layer_split(_devices(1024, 1024), shape, _layout(uneven_model), counts_process=True)
    first, last = (share.terms for share in layers.shares)
    assert first["torch_runtime"] > 0 and first["activations"] > 0 and "torch_runtime" not in last
    rows = plan_row_split(_devices(1024, 1024), shape, _layout(uneven_model), counts_process=True)
    assert all(share.terms["torch_runtime"] > 0 and share.terms["distributed_runtime"] > 0 for share in rows.shares)
    assert not plan_row_split(_devices(256, 256), shape, _layout(uneven_model), counts_process=True).feasible
    gpus = [DeviceBudget("cuda:0", 4 << 30), DeviceBudget("cuda:1", 4 << 30)]
    on_gpus = _layout(uneven_model, weights_format="bf16", kv_dtype="bf16", on_gpu=True)
    assert "torch_runtime" not in plan_row_split(gpus, shape, on_gpus, counts_process=True).shares[0].terms


def test_a_tied_head_costs_the_last_device_a_copy_of_the_embeddings(uneven_model):
    shape = shape_from_gguf(uneven_model)
    untied = plan_layer_split(_devices(4, 4), shape, _layout(uneven_model))
    tied = plan_layer_split(_devices(4, 4), shape, _layout(uneven_model, is_tied=True))
    head_bytes = shape.vocab_size * shape.hidden_size * 4
    assert tied.shares[1].terms["output_head"] == untied.shares[1].terms["output_head"]  # a copy in place of a head
    assert plan_layer_split(_devices(8), shape, _layout(uneven_model, is_tied=True)).shares[0].peak_bytes == (
        sum(share.peak_bytes for share in tied.shares) - head_bytes)


def test_gpu_split_plans_count_activations_buffers_reserve_and_a_context_per_device(uneven_model):
    """Only the tensors were planned on GPUs: the activations of the widest forward, the hidden states handed
    to the next device, the all-reduce buffers, the allocator's reserve and each GPU's CUDA context were not."""
    shape = shape_from_gguf(uneven_model)
    layout = _layout(uneven_model, weights_format="bf16", kv_dtype="bf16", on_gpu=True, n_batch=64)
    gpus = [DeviceBudget("cuda:0", 4 << 30), DeviceBudget("cuda:1", 4 << 30)]
    layers = plan_layer_split(gpus, shape, layout, (2, 2))
    first, last = (share.terms for share in layers.shares)
    assert first["cuda_context"] == last["cuda_context"] == TORCH_CUDA_CONTEXT_BYTES
    assert "activation_buffers" not in first and last["activation_buffers"] == 64 * shape.hidden_size * 2
    assert last["activations"] - first["activations"] == shape.vocab_size * (2 + 4)  # one logits row, bf16 and fp32
    assert all(share.terms["allocator_reserve"] > 0 for share in layers.shares)
    assert all(share.peak_bytes > tensor_bytes(share) + TORCH_CUDA_CONTEXT_BYTES for share in layers.shares)
    rows = plan_row_split(gpus, shape, layout)
    assert all(share.terms["activation_buffers"] >= 2 * 64 * shape.hidden_size * 2 for share in rows.shares)
    on_cpus = plan_layer_split(_devices(8, 8), shape, _layout(uneven_model))
    assert all(share.peak_bytes == tensor_bytes(share) for share in on_cpus.shares)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA/ROCm GPU")
def test_on_one_gpu_the_allocator_holds_what_the_plan_counts(uneven_model):
    """The per-device plan of a single GPU against torch's allocator (which rounds each tensor up to 512 bytes)."""
    shape = shape_from_gguf(uneven_model)
    plan = plan_layer_split([DeviceBudget("cuda:0", 1 << 40)], shape, _layout(uneven_model, weights_format="bf16",
                                                                              kv_dtype="bf16", on_gpu=True))
    before = torch.cuda.memory_allocated(0)
    settings = ModelSettings(backend="torch", weights="bf16", max_context=256, device="cuda:0")
    with TorchBackend.open(uneven_model, settings) as backend:
        allocated = torch.cuda.memory_allocated(0) - before
        num_tensors = len(list(backend.model.parameters())) + len(list(backend.model.buffers())) + 2 * 4
        assert 0 <= allocated - tensor_bytes(plan.shares[0]) <= 512 * num_tensors
