"""q/k/v and gate/up as one matmul each (pocketspec/torch_model/fused_projections.py), on the CPU: the
same outputs and tokens, every weight held once, and what cannot fuse left apart."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import built_engine
from pocketspec.torch_model.fused_projections import fuse_projections, unfuse_projections
from pocketspec.torch_model.model import ModelConfig, Transformer, rope_angles
from pocketspec.torch_model.quantize import Int4Linear, Int8Linear, swap_linears
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = ModelConfig("qwen2", 2, 64, 4, 2, 16, 128, 300, 10000.0, 1e-5, has_qkv_bias=True, is_tied=True)


def _random_model(weights: str, config: ModelConfig = CONFIG) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.1)
    floats = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    swap_linears(model, weights, torch.float32)
    for name, module in model.named_modules():
        if isinstance(module, (Int8Linear, Int4Linear)):
            module.load(floats[name].weight.detach())
            if module.bias is not None:  # the twin's bias is new and unset (torch.empty: whatever memory held)
                with torch.no_grad():
                    module.bias.copy_(floats[name].bias)
    return model.eval()


def _tensor_bytes(model) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in [*model.parameters(), *model.buffers()])


@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_fused_projections_give_the_parts_outputs_and_hold_each_weight_once(weights):
    model = _random_model(weights)
    block = model.layers[0]
    x = torch.randn(1, 3, CONFIG.dim)
    cos, sin = rope_angles(torch.arange(3), model.inv_freq)
    with torch.inference_mode():
        apart = (*block.project(x, cos, sin), block.feed_forward(x))
    num_bytes, num_tensors = _tensor_bytes(model), len([*model.parameters(), *model.buffers()])
    fuse_projections(model)
    fused_qkv = block.attention.wqkv
    assert fused_qkv is not None and block.feed_forward.w_gate_up is not None
    with torch.inference_mode():
        together = (*block.project(x, cos, sin), block.feed_forward(x))
    for got, expected in zip(together, apart):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # the parts are views of the fused weight, and the model's tensors count each byte once
    assert _tensor_bytes(model) == num_bytes and len([*model.parameters(), *model.buffers()]) == num_tensors
    whole = fused_qkv.linear.weight
    assert block.attention.wk.weight.data_ptr() == whole[CONFIG.num_heads * CONFIG.head_dim:].data_ptr()
    fuse_projections(model)
    assert block.attention.wqkv is fused_qkv  # fusing again changes nothing
    unfuse_projections(model)
    with torch.inference_mode():
        torch.testing.assert_close(block.feed_forward(x), apart[-1], rtol=1e-5, atol=1e-6)


def test_int4_projections_fuse_when_their_rows_fill_whole_blocks_and_give_the_parts_outputs():
    config = replace(CONFIG, dim=128, head_dim=32, ffn_dim=192)  # q 128, k and v 64, gate and up 192 rows
    model = _random_model("int4", config)
    block = model.layers[0]
    assert block.attention.wq.kernel == "cpu"  # packed for the CPU kernel, in blocks of 32 or 64 rows
    x = torch.randn(1, 3, config.dim)
    cos, sin = rope_angles(torch.arange(3), model.inv_freq)
    with torch.inference_mode():
        apart = (*block.project(x, cos, sin), block.feed_forward(x))
    num_bytes = _tensor_bytes(model)
    fuse_projections(model)
    assert block.attention.wqkv is not None and block.feed_forward.w_gate_up is not None
    assert _tensor_bytes(model) == num_bytes and not block.attention.wk.scales_and_zeros.is_contiguous()
    with torch.inference_mode():
        together = (*block.project(x, cos, sin), block.feed_forward(x))
        # every output is its own weight row's work: fused, the same numbers (within the kernel's bf16 rounding)
        for got, expected in zip(together, apart):
            torch.testing.assert_close(got, expected, rtol=2 ** -8, atol=1e-6)
        unfuse_projections(model)  # a part alone reads its share of the fused scales
        torch.testing.assert_close(block.feed_forward(x), apart[-1], rtol=2 ** -8, atol=1e-6)


def test_int4_projections_with_rows_short_of_a_block_stay_apart():
    model = _random_model("int4")  # k and v have 32 rows
    fuse_projections(model)
    assert all(block.attention.wqkv is None for block in model.layers)
    assert all(block.feed_forward.w_gate_up is not None for block in model.layers)  # 128 rows each


@pytest.mark.parametrize("weights", ["fp32", "int8", "int4"])
def test_a_fused_static_step_decodes_the_dynamic_paths_tokens(tmp_path, weights):
    target, _ = write_tiny_pair(tmp_path, quant=None)
    options = dict(backend="torch", weights=weights, drafter="ngram", gamma=4)
    with built_engine(target, decode_step="dynamic", **options) as engine:
        prompt = engine.target.tokenizer.encode("the cat is def return", add_bos=True)
        expected = engine.generate(prompt, 100).tokens
    with built_engine(target, decode_step="static", **options) as engine:
        fuse_projections(engine.target.model)  # what a GPU's static step does when it opens
        assert engine.target.model.layers[0].feed_forward.w_gate_up is not None
        result = engine.generate(prompt, 100)
    assert result.tokens == expected and result.stats.num_accepted > 0


def test_batch_invariant_tiles_drop_the_fused_projections_and_never_fuse():
    from pocketspec.torch_model.invariant import TileShape, make_batch_invariant

    model = _random_model("fp32")
    fuse_projections(model)
    make_batch_invariant(model, TileShape(rows=4))
    fuse_projections(model)
    assert all(block.attention.wqkv is None and not hasattr(block.feed_forward, "w_gate_up") for block in model.layers)
