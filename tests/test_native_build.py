"""native/llama_build.sh: the CMake arguments of each accelerator (the recipes are shell; nothing is built here),
and what native/build_llama_cpp.sh installed in this venv (as `make setup` builds it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cmake_args(accel: str, **env: str) -> subprocess.CompletedProcess:
    script = f'source "{ROOT}/native/llama_build.sh"; llama_cmake_args {accel}'
    clean = {key: value for key, value in os.environ.items()
             if key not in ("POCKETSPEC_CUDA_ARCHITECTURES", "POCKETSPEC_GPU_TARGETS")}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**clean, **env})


def test_gpu_builds_name_their_architectures():
    """No list made a non-native CUDA build PTX-only for sm_75/80/90: minutes of JIT at the first load."""
    cuda = _cmake_args("cuda").stdout
    assert "-DGGML_CUDA=on" in cuda and "-DCMAKE_CUDA_ARCHITECTURES=75-real;80-real;86-real;89-real;90-real;" in cuda
    assert "-DGPU_TARGETS=gfx906;gfx908;gfx90a;gfx942;gfx1030;gfx1100" in _cmake_args("rocm").stdout
    assert "ARCHITECTURES" not in _cmake_args("cpu").stdout


def test_the_architecture_lists_can_be_overridden():
    assert _cmake_args("cuda", POCKETSPEC_CUDA_ARCHITECTURES="89-real").stdout.strip().endswith(
        "-DCMAKE_CUDA_ARCHITECTURES=89-real")
    assert _cmake_args("rocm", POCKETSPEC_GPU_TARGETS="gfx1100").stdout.strip().endswith("-DGPU_TARGETS=gfx1100")


def test_an_unknown_accelerator_is_one_line_and_status_2():
    found = _cmake_args("metal")
    assert found.returncode == 2 and found.stderr.count("\n") == 1 and "not one of" in found.stderr


def test_the_installed_bindings_hold_each_library_once_and_nothing_outside_their_package():
    """The wheel's excludes (native/build_llama_cpp.sh): no lib/ or include/ at the top of site-packages and
    no library under its three names (.so, .so.0, .so.0.25.3); that the kept names link, every test that
    loads a model shows."""
    import importlib.metadata
    import re

    files = [str(path) for path in importlib.metadata.files("llama-cpp-python")]
    assert not [name for name in files if not name.startswith(("llama_cpp/", "llama_cpp_python-"))]
    libraries = [name.rsplit("/", 1)[1] for name in files if name.startswith("llama_cpp/lib/")]
    assert libraries and not [name for name in libraries if re.search(r"\.so\.\d+\.", name)]
    stems = [name.split(".so")[0] for name in libraries]
    assert {stem for stem in stems if stems.count(stem) > 1} <= {"libggml"}  # the bindings open libggml.so by name
