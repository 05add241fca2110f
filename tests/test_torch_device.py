"""Which 2-byte float a GPU computes in, decided from its architecture (GPUs described, not present)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pocketspec.backends.torch_backend import resolve_weights_format
from pocketspec.torch_model.device import gpu_float_format
from pocketspec.torch_model.load import compute_dtype

GPU = torch.device("cuda", 1)


def _describe_cuda(monkeypatch, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device: capability if device == GPU else pytest.fail(f"asked about {device}"))


def _describe_rocm(monkeypatch, arch: str) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(gcnArchName=arch) if device == GPU
                        else pytest.fail(f"asked about {device}"))


@pytest.mark.parametrize("capability, expected", [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"),
                                                  ((8, 9), "bf16"), ((9, 0), "bf16")])
def test_cuda_gpus_before_sm80_compute_in_fp16(monkeypatch, capability, expected):
    _describe_cuda(monkeypatch, capability)  # V100, T4, A100, RTX 4090, H100
    assert gpu_float_format(GPU) == expected
    assert resolve_weights_format("auto", GPU) == expected
    assert compute_dtype("int8", GPU) == compute_dtype("int4", GPU) == {"fp16": torch.float16,
                                                                       "bf16": torch.bfloat16}[expected]


@pytest.mark.parametrize("arch, expected", [("gfx906:sramecc+:xnack-", "fp16"), ("gfx900", "fp16"),
                                            ("gfx90a:sramecc+:xnack-", "bf16"), ("gfx942", "bf16"),
                                            ("gfx1100", "bf16"), ("gfx1030", "fp16")])
def test_rocm_gpus_without_bf16_arithmetic_compute_in_fp16(monkeypatch, arch, expected):
    _describe_rocm(monkeypatch, arch)  # MI50, Vega, MI250, MI300, RX 7900, RX 6900
    assert gpu_float_format(GPU) == expected


def test_explicit_formats_and_the_cpu_are_untouched(monkeypatch):
    _describe_cuda(monkeypatch, (7, 5))
    assert resolve_weights_format("bf16", GPU) == "bf16"
    assert resolve_weights_format("auto", torch.device("cpu")) == "fp32"
    assert compute_dtype("int8", torch.device("cpu")) == torch.float32


def test_compiling_is_the_default_on_a_gpu_only():
    """Unset, --compile means: on a GPU with the static step (whose CUDA graphs then replay compiled
    blocks); never on a CPU, where compiling costs a minute and buys little; an explicit choice wins."""
    from pocketspec.settings import ModelSettings

    assert ModelSettings(backend="torch", device="cuda").compiles
    assert not ModelSettings(backend="torch", device="cuda", decode_step="dynamic").compiles
    assert not ModelSettings(backend="torch", device="cuda", compile=False).compiles
    assert not ModelSettings(backend="torch", device="cpu").compiles
    assert ModelSettings(backend="torch", device="cpu", compile=True).compiles


def test_compiling_asked_for_takes_the_static_step_unless_the_dynamic_one_is_named():
    """Compiled, the dynamic step decoded SmolLM2 at about 1 tok/s on a 2-core CPU (13 eager; the compiled static
    step about 11), so --compile with --decode-step auto compiles the static step."""
    from pocketspec.settings import ModelSettings

    assert ModelSettings(backend="torch", device="cpu", compile=True).uses_static_step
    assert not ModelSettings(backend="torch", device="cpu").uses_static_step
    assert not ModelSettings(backend="torch", device="cpu", compile=False).uses_static_step
    assert not ModelSettings(backend="torch", device="cpu", compile=True, decode_step="dynamic").uses_static_step
    assert not ModelSettings(backend="torch", devices=("cpu:0", "cpu:1"), compile=True).uses_static_step
