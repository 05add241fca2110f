"""`pocketspec doctor`: what this machine and this install can run, for bug reports.

It reports the llama-cpp-python build (version, accelerator from the build stamp that
native/build_llama_cpp.sh writes into the venv, llama.cpp's system info), CPU features,
GPUs, memory, and which catalog models are downloaded. Every probe is optional: a
missing tool is reported, never fatal.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import click
import psutil

from apps.backend_options import backend_options
from apps.options import model_choice_options, threads_option
from pocketspec.catalog import folder_problem, load_catalog, model_path, models_dir, pocketspec_home

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
    except Exception as error:  # a broken native build can raise anything on import
        report["import_error"] = f"{type(error).__name__}: {error}"
    report["build"] = read_build_stamp()
    return report


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


def _models_report() -> dict:
    catalog = load_catalog()
    return {name: {"downloaded": model_path(name).exists(), "path": str(model_path(name))}
            for name in catalog.models}


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
        "memory": {"total_bytes": memory.total, "available_bytes": memory.available},
        "models": _models_report(),
    }


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def _print_human(report: dict) -> None:
    llama = report["llama_cpp"]
    build = llama["build"] or {}
    click.echo(f"python            {report['python']}")
    click.echo(f"llama-cpp-python  {llama['version'] or 'not installed'}"
               f"{'' if llama['importable'] else ' (not importable: ' + llama.get('import_error', '?') + ')'}")
    click.echo(f"built for         {build.get('accel', 'unknown (not built by native/build_llama_cpp.sh)')}")
    if build.get("cmake_args"):
        click.echo(f"cmake args        {build['cmake_args']}")
    if llama["system_info"]:
        click.echo(f"llama.cpp         {llama['system_info']}")
    cpu = report["cpu"]
    flags = " ".join(f"{flag}={'yes' if present else 'no'}" for flag, present in cpu["flags"].items())
    click.echo(f"cpu               {cpu['model']} ({cpu['num_logical_cores']} logical cores)")
    click.echo(f"cpu flags         {flags}")
    gpu = report["gpu"]
    gpus = [f"nvidia: {gpu['nvidia_smi']}" if gpu["nvidia_smi"] else None,
            f"rocm: {gpu['rocm_smi']}" if gpu["rocm_smi"] else None,
            f"torch.cuda: {gpu['torch_cuda']}" if gpu["torch_cuda"] else None]
    click.echo(f"gpus              {'; '.join(g for g in gpus if g) or 'none found'}")
    torch_info = report["torch"]
    if torch_info is None:
        click.echo("torch             not installed (--backend torch unavailable)")
    elif "build" in torch_info:
        gpus = ", ".join(torch_info["devices"]) or "no GPU visible"
        note = "; ROCm GPUs appear as --device cuda" if torch_info["build"].startswith("rocm") else ""
        click.echo(f"torch             {torch_info['version']} ({torch_info['build']} build; {gpus}{note})")
    else:
        click.echo(f"torch             not importable: {torch_info['error']}")
    memory = report["memory"]
    click.echo(f"memory            {_gib(memory['available_bytes'])} available of {_gib(memory['total_bytes'])}")
    problem = report["pocketspec_home_problem"]
    click.echo(f"POCKETSPEC_HOME   {report['pocketspec_home']}"
               + (f" (cannot hold downloads: {problem})" if problem else ""))
    for name, model in report["models"].items():
        click.echo(f"  {name:32} {'present' if model['downloaded'] else 'not downloaded'}")


def _calibrate(target, draft, pair, threads, backend_options) -> None:
    from apps.backend_options import apply_backend_options
    from apps.options import SPECULATION
    from pocketspec.calibrate import calibrate_models, describe_costs
    from pocketspec.loader import choose_models
    from pocketspec.settings import ModelSettings

    choice = choose_models(target=target, draft=draft, pair=pair)
    settings, _ = apply_backend_options(ModelSettings(num_threads=threads), SPECULATION, backend_options)
    for costs in calibrate_models(choice.target_path, choice.draft_path, settings,
                                  on_measure=lambda line: click.echo(line, err=True)):
        click.echo(f"{json.loads(costs.key)['model']}:")
        for line in describe_costs(costs):
            click.echo(line)


@click.command(name="doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--calibrate", is_flag=True,
              help="Measure the models' forward costs by width and context on this machine again (the table "
                   "the adaptive γ and the planner use; otherwise measured once at first use).")
@model_choice_options
@threads_option
@backend_options
def doctor(as_json: bool, calibrate: bool, target, draft, pair, threads, **backend_args) -> None:
    """Report the llama.cpp build, CPU, GPUs, memory and downloaded models."""
    if calibrate:
        _calibrate(target, draft, pair, threads, backend_args)
        return
    report = collect_report()
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_human(report)


COMMANDS = [doctor]
