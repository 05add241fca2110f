"""The planner's torch byte counts equal the bytes the torch loader really allocates, in every format."""

from __future__ import annotations

import numpy as np
import pytest

from memplanner.shapes import shape_from_gguf
from memplanner.torch_sizes import gguf_layout, torch_kv_bytes, torch_weight_bytes
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.settings import ModelSettings
from tiny_models import tiny_vocabulary, tiny_weights, write_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPE = dict(dim=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_dim=128)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("tiny_sizes")
    vocab_size = len(tiny_vocabulary()[0])
    models = {}
    for arch in ("llama", "qwen2"):
        tensors = tiny_weights(np.random.default_rng(1), vocab_size, **SHAPE, has_qkv_bias=arch == "qwen2")
        if arch == "qwen2":
            del tensors["output.weight"]  # tied embeddings
        models[arch] = write_tiny_model(folder / f"{arch}.gguf", tensors, arch=arch, quant=None, **SHAPE)
    return models


def _allocated_weight_bytes(backend) -> int:
    tensors = {id(t): t for t in [*backend.model.parameters(), *backend.model.buffers()]}.values()
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


@pytest.mark.parametrize("weights", ["fp32", "bf16", "fp16", "int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_planned_weight_bytes_equal_what_the_loader_allocates(tiny_models, arch, weights):
    path = tiny_models[arch]
    is_tied, has_qkv_bias = gguf_layout(path)
    assert (is_tied, has_qkv_bias) == (arch == "qwen2", arch == "qwen2")
    planned = torch_weight_bytes(shape_from_gguf(path), weights, is_tied=is_tied, has_qkv_bias=has_qkv_bias)
    with TorchBackend.open(path, ModelSettings(backend="torch", weights=weights, max_context=64)) as backend:
        assert _allocated_weight_bytes(backend) == planned == backend.memory_report()["weights"]
        logits = backend.prefill([1, 40, 41, 42])
    assert np.isfinite(logits).all()


@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16", "fp16", "int8"])
def test_planned_kv_bytes_equal_the_static_cache(tiny_models, kv_dtype):
    path = tiny_models["llama"]
    settings = ModelSettings(backend="torch", max_context=200, torch_kv_type=kv_dtype)
    with TorchBackend.open(path, settings) as backend:
        assert backend.memory_report()["kv_cache"] == torch_kv_bytes(shape_from_gguf(path), kv_dtype, 200)


def test_quantized_formats_stay_close_to_fp32(tiny_models):
    tokens = [1, 40, 41, 42, 43, 44]
    logits = {}
    for weights in ("fp32", "int8", "int4"):
        with TorchBackend.open(tiny_models["llama"], ModelSettings(backend="torch", weights=weights)) as backend:
            logits[weights] = backend.prefill(tokens)
    for weights, tolerance in (("int8", 0.02), ("int4", 0.3)):
        error = np.abs(logits[weights] - logits["fp32"]).max() / np.abs(logits["fp32"]).max()
        assert error < tolerance, f"{weights}: relative error {error:.3f}"
