"""pocketspec/torch_model/torchao_linears.py on the CPU: torchao's int8 weight-only tensors take the int8
linears' place (fused projections' too) and give their logits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pocketspec.torch_model.fused_projections import fuse_projections
from pocketspec.torch_model.kv_cache import StaticKVCache
from pocketspec.torch_model.model import ModelConfig
from pocketspec.torch_model.quantize import Int8Linear
from pocketspec.torch_model.torchao_linears import use_torchao_int8

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import torch_gpu_roofline as roofline  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CONFIG = ModelConfig("qwen2", 2, 64, 4, 2, 16, 128, 300, 10000.0, 1e-5, has_qkv_bias=True, is_tied=False)


def _logits(model) -> torch.Tensor:
    cache = StaticKVCache(num_layers=CONFIG.num_layers, num_kv_heads=CONFIG.num_kv_heads, head_dim=CONFIG.head_dim,
                          max_context=32, kv_dtype="fp32", device=torch.device("cpu"))
    with torch.inference_mode():
        return model(torch.tensor([[1, 2, 3, 4]]), 0, cache, torch.arange(4))


def test_torchao_int8_linears_give_the_int8_linears_logits():
    torch.manual_seed(0)
    model = roofline.random_model(CONFIG, "int8", torch.device("cpu"))
    expected = _logits(model)
    fuse_projections(model)
    # per block: q/k/v and gate/up fused, wo and w_down alone; and the untied head
    assert use_torchao_int8(model) == 4 * CONFIG.num_layers + 1
    # the parts stay int8 linears (views of the fused weights), for a path that unfuses
    assert sum(isinstance(module, Int8Linear) for module in model.modules()) == 5 * CONFIG.num_layers
    got = _logits(model)
    assert (got - expected).abs().max() < 1e-2 * expected.abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
