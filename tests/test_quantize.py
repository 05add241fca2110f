"""The int8 / int4 linears on torch's fused kernels: close to the dequantized reference, never
materialising a float weight, batch-invariant, and packed in slices exactly as in one piece."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from pocketspec.torch_model import quant_kernels
from pocketspec.torch_model.quantize import Int4Linear, Int8Linear

CPU = torch.device("cpu")
# (in, out) of SmolLM2-135M's projections, a tiny model's, and the tiny head (304 = 19 x 16)
SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (64, 32), (64, 304)]


def _quantized(kind, num_in: int, num_out: int, seed: int = 0, bias: bool = True):
    """A linear of `kind` loaded with random weights; returns it and its dequantized float weight."""
    generator = torch.Generator().manual_seed(seed)
    linear = kind(num_in, num_out, bias, torch.float32)
    linear.materialize(CPU)
    linear.load_rows(0, torch.randn(num_out, num_in, generator=generator) / num_in ** 0.5)
    reference = linear.dequantized(torch.float32)  # before pack: int4's codes are still readable
    linear.pack()
    if bias:
        linear.bias = torch.nn.Parameter(torch.randn(num_out, generator=generator), requires_grad=False)
    return linear, reference


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
@pytest.mark.parametrize("num_in, num_out", SHAPES)
def test_fused_kernels_stay_close_to_the_dequantized_reference(one_torch_thread, kind, num_in, num_out):
    linear, weight = _quantized(kind, num_in, num_out)
    assert linear.kernel == "cpu"
    x = torch.randn(2, 5, num_in, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got, expected = linear(x), F.linear(x, weight, linear.bias)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    # the kernels take bf16 activations and round their output to bf16 (2^-9 relative each)
    assert (got - expected).abs().max() < 1e-2 * expected.abs().max()


def test_int4_rows_the_cpu_kernel_cannot_take_are_dequantized_in_the_call(one_torch_thread):
    linear, weight = _quantized(Int4Linear, 64, 20)  # 20 outputs: not a multiple of 16
    assert linear.kernel == "dequantize"
    x = torch.randn(3, 64)
    assert torch.allclose(linear(x), F.linear(x, weight, linear.bias), atol=1e-5)


class _LargestOutput(TorchDispatchMode):
    """Records the largest tensor any aten op returns."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_a_forward_never_materialises_the_float_weight(one_torch_thread, kind):
    linear, _ = _quantized(kind, 576, 1536)
    x = torch.randn(1, 4, 576)
    with torch.inference_mode(), _LargestOutput() as recorder:
        linear(x)
    assert recorder.largest <= 4 * 1536  # the output rows; the weight has 576 x 1536 elements


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_a_row_never_depends_on_its_neighbours(kind, num_threads):
    """What the batch-invariant path needs of a linear: each row bit-identical alone or in any batch."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        generator = torch.Generator().manual_seed(2)
        for num_in, num_out in SHAPES:
            linear, _ = _quantized(kind, num_in, num_out)
            rows = torch.randn(13, num_in, generator=generator)
            with torch.inference_mode():
                alone = torch.cat([linear(row[None]) for row in rows])
                for num_rows in (2, 5, 13):
                    order = torch.randperm(len(rows), generator=generator)[:num_rows]
                    assert torch.equal(linear(rows[order]), alone[order]), (num_in, num_out, num_rows)
    finally:
        torch.set_num_threads(previous)


def test_int4_packs_in_slices_exactly_as_in_one_piece(one_torch_thread, monkeypatch):
    num_out, num_in = 64 * 5 + 16, 128  # a last slice shorter than the others
    generator = torch.Generator().manual_seed(3)
    linear = Int4Linear(num_in, num_out, False, torch.float32)
    linear.materialize(CPU)
    linear.load_rows(0, torch.randn(num_out, num_in, generator=generator))
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(linear.codes().to(torch.int32), 2)
    monkeypatch.setattr(quant_kernels, "PACK_SLICE_BYTES", 64 * 4 * num_in)  # slices of 64 rows
    linear.pack()
    assert torch.equal(linear.weight, whole)


def test_loading_in_chunks_equals_loading_whole(one_torch_thread):
    weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(4))
    for kind in (Int8Linear, Int4Linear):
        whole, chunked = kind(64, 96, False, torch.float32), kind(64, 96, False, torch.float32)
        whole.load(weight)
        chunked.materialize(CPU)
        for start in range(0, 96, 40):
            chunked.load_rows(start, weight[start:start + 40])
        chunked.pack()
        assert all(torch.equal(a, b) for a, b in zip(whole.buffers(), chunked.buffers()))


def test_scales_are_two_bytes_and_codes_use_the_stored_scale(one_torch_thread):
    linear, weight = _quantized(Int8Linear, 64, 32, bias=False)
    assert linear.scales.dtype == torch.bfloat16
    original = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)) / 64 ** 0.5
    # nearest code against the rounded scale: at most half a step off (plus float rounding)
    assert ((weight - original).abs() <= linear.scales.float()[:, None] * 0.5 + 1e-6).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA/ROCm GPU")
@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_gpu_kernels_stay_close_to_the_dequantized_reference(kind):
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    linear = kind(576, 1536, False, torch.bfloat16)
    linear.materialize(device)
    linear.load_rows(0, torch.randn(1536, 576, device=device, generator=generator) / 24)
    weight = linear.dequantized(torch.float32)
    linear.pack()
    for num_rows in (1, 5, 64):  # decode, verify and a prompt chunk
        x = torch.randn(num_rows, 576, device=device, generator=generator, dtype=torch.bfloat16)
        expected = F.linear(x.float(), weight)
        assert (linear(x).float() - expected).abs().max() < 2e-2 * expected.abs().max(), (linear.kernel, num_rows)


@pytest.mark.parametrize("num_rows, materialized", [(1, False), (1, True), (5, False)])
def test_compiled_int8_rows_on_a_gpu_take_a_path_that_stays_close_to_the_reference(one_torch_thread, monkeypatch,
                                                                                    num_rows, materialized):
    """Under torch.compile a "cuda-int8" linear runs int8_reduction (one row; its rows computed first or
    not) or int8_dequantized_mm (more), here on the CPU; the matmul's weight is dequantized a slice of
    10 rows at a time."""
    monkeypatch.setattr(quant_kernels, "INT8_DEQUANTIZE_SLICE_BYTES", 10 * 64 * 4)
    monkeypatch.setattr(quant_kernels, "MATERIALIZE_REDUCTION_ROWS", materialized)
    linear, weight = _quantized(Int8Linear, 64, 96)
    linear.kernel = "cuda-int8"
    x = torch.randn(1, num_rows, 64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got = torch.compile(linear.forward, fullgraph=True)(x)
    torch.testing.assert_close(got, F.linear(x, weight, linear.bias), rtol=1e-5, atol=1e-5)
