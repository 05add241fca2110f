"""What this machine and this install can run, as plain data: the llama-cpp-python build (version,
accelerator from the build stamp that native/build_llama_cpp.sh writes into the venv, llama.cpp's
system info), CPU features, GPUs, torch, memory, huge pages, and which catalog models are downloaded.

Every probe is optional: a missing tool is reported, never fatal. `pocketspec doctor` prints it;
`pocketspec bench` records it beside its results.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import json
from pathlib import Path

import psutil

from pocketspec import huge_pages
from pocketspec.models.catalog import (download_state, folder_problem, load_catalog, model_path, models_dir,
                                       pocketspec_home)

CPU_FLAGS_OF_INTEREST = ("avx", "avx2", "avx512f", "avx512_vnni", "amx_tile", "f16c", "fma")
BUILD_STAMP_NAME = "pocketspec-llama-build.json"


def read_build_stamp() -> dict | None:
    """What native/build_llama_cpp.sh recorded of this venv's llama.cpp build; None when it did not."""
    stamp = Path(sys.prefix) / BUILD_STAMP_NAME
    if not stamp.exists():
        return None
    try:
        return json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return {"error": f"unreadable build stamp {stamp}"}


def _llama_report() -> dict:
    report: dict = {"version": None, "importable": False, "system_info": None, "build": None}
    try:
        report["version"] = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        import llama_cpp

        report["importable"] = True
        report["system_info"] = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
        from pocketspec.backends.ggml_ops import row_exact_max_rows

        report["row_exact_max_rows"] = row_exact_max_rows()
    except Exception as error:  # a broken native build can raise anything on import
        report["import_error"] = f"{type(error).__name__}: {error}"
    report["build"] = read_build_stamp()
    return report


def cpu_name() -> str:
    """The CPU as a figure should name it: model name, family and model (/proc/cpuinfo's first core)."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name')} (family {fields.get('cpu family')} model {fields.get('model')})"


def _cpu_report() -> dict:
    flags: set[str] = set()
    model_name = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            elif key.strip() == "model name" and model_name is None:
                model_name = value.strip()
    except OSError:
        pass
    return {
        "model": model_name,
        "num_logical_cores": psutil.cpu_count(logical=True),
        "flags": {flag: flag in flags for flag in CPU_FLAGS_OF_INTEREST},
    }


def _run_tool(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _gpu_report() -> dict:
    report: dict = {
        "nvidia_smi": _run_tool(["nvidia-smi", "--query-gpu=name,memory.total,memory.free,driver_version",
                                 "--format=csv,noheader"]),
        "rocm_smi": _run_tool(["rocm-smi", "--showproductname", "--showmeminfo", "vram"]),
        "torch_cuda": None,
    }
    if importlib.util.find_spec("torch") is not None:
        try:
            import torch

            if torch.cuda.is_available():
                report["torch_cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            else:
                report["torch_cuda"] = []
        except Exception as error:  # torch's CUDA init fails in many driver-specific ways
            report["torch_cuda"] = f"error: {error}"
    return report


def _torch_report() -> dict | None:
    """torch's version and GPU build (CUDA or ROCm, which also reports its GPUs as cuda)."""
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        from pocketspec.torch_model.device import torch_report

        return torch_report()
    except Exception as error:  # a broken torch install can raise anything on import
        return {"error": f"{type(error).__name__}: {error}"}


def _onnx_report() -> dict | None:
    """onnxruntime's version and the --ep names its build offers (None: not installed)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    try:
        import onnxruntime

        from pocketspec.backends.onnx_backend import available_providers

        return {"version": onnxruntime.__version__, "execution_providers": available_providers()}
    except Exception as error:  # a broken install can raise anything on import
        return {"error": f"{type(error).__name__}: {error}"}


def _models_report() -> dict:
    catalog = load_catalog()
    states = {name: download_state(entry) for name, entry in catalog.models.items()}
    return {name: {"downloaded": state == "yes", "incomplete": state == "incomplete", "path": str(model_path(name))}
            for name, state in states.items()}


def collect_report() -> dict:
    """Everything doctor knows, as plain data (sizes in bytes)."""
    memory = psutil.virtual_memory()
    return {
        "python": sys.version.split()[0],
        "pocketspec_home": str(pocketspec_home()),
        "pocketspec_home_problem": folder_problem(models_dir()),
        "llama_cpp": _llama_report(),
        "cpu": _cpu_report(),
        "gpu": _gpu_report(),
        "torch": _torch_report(),
        "onnxruntime": _onnx_report(),
        "memory": {"total_bytes": memory.total, "available_bytes": memory.available},
        "huge_pages": huge_pages.current_state(),
        "models": _models_report(),
    }
