"""A device the backend cannot use is an error before anything loads, never a silent CPU run;
a row split needs two or more devices (pocketspec/backends/device_check.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pocketspec.backends.device_check import check_devices
from pocketspec.errors import UserError
from pocketspec.settings import ModelSettings


def _llama_has_gpus() -> bool:
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def _torch_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli", *args], capture_output=True, text=True, timeout=300)


def _assert_one_line(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert fragment in lines[0], lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("split_mode, devices", [("row", ()), ("row", ("cpu:0",)), ("row", ("cuda:0",))])
def test_row_split_needs_two_devices(split_mode, devices):
    for backend in ("llama.cpp", "torch"):
        with pytest.raises(UserError, match="--split-mode row .* two or more --devices"):
            check_devices(ModelSettings(backend=backend, split_mode=split_mode, devices=devices))


@pytest.mark.parametrize("devices", [("cuda:0",), ("cuda:7",), ("rocm:0",), ("cpu:0", "cuda:0")])
def test_llama_cpu_build_refuses_any_gpu(devices):
    if _llama_has_gpus():
        pytest.skip("this llama.cpp build offloads to GPUs")
    with pytest.raises(UserError, match="runs on the CPU only"):
        check_devices(ModelSettings(devices=devices))


@pytest.mark.parametrize("devices", [("cuda:7",), ("cuda:0", "cuda:99")])
def test_torch_refuses_a_gpu_it_does_not_see(devices):
    if _torch_gpus() > 99:
        pytest.skip("a machine with 100 GPUs")
    with pytest.raises(UserError, match="--devices"):
        check_devices(ModelSettings(backend="torch", devices=devices))


def test_cpu_devices_pass():
    check_devices(ModelSettings(devices=("cpu:0", "cpu:1"), split_mode="row"))
    check_devices(ModelSettings(backend="torch", devices=("cpu:0", "cpu:1")))
    check_devices(ModelSettings(backend="torch", device="cpu"))


@pytest.mark.parametrize("flags, fragment", [
    (["--devices", "cuda:0"], "CPU only"),
    (["--devices", "cuda:7"], "CPU only"),
    (["--devices", "rocm:0"], "CPU only"),
    (["--split-mode", "row"], "two or more --devices"),
    (["--split-mode", "row", "--devices", "cpu:0"], "two or more --devices"),
    (["--backend", "torch", "--devices", "cuda:0"], "cuda:0"),
    (["--backend", "torch", "--device", "cuda:7"], "cuda:7"),
    (["--backend", "torch", "--device", "rocm"], "rocm"),
])
def test_cli_refuses_devices_it_cannot_use(smollm2_path, flags, fragment):
    if "--backend" not in flags and "--split-mode" not in flags and _llama_has_gpus():
        pytest.skip("this llama.cpp build offloads to GPUs")
    if "--backend" in flags and _torch_gpus() > 0 and "cuda:0" in flags:
        pytest.skip("torch sees a GPU")
    result = _cli("generate", "--target", str(smollm2_path), "--draft", "none", "--prompt", "hi",
                  "--max-tokens", "2", *flags)
    _assert_one_line(result, fragment)
