# Shared by the two llama.cpp builds, build_llama_cpp.sh (the Python bindings) and
# build_llama_tools.sh (llama.cpp's own tools): the version, the portable CMake flags (their
# one home) and the build stamps. Sourced, not run:
#
#   source native/llama_build.sh; CMAKE_ARGS="$(llama_cmake_args cpu)" || exit 2

LLAMA_CPP_PYTHON_VERSION="0.3.36"

# GGML_NATIVE=ON (the default) picks the AMX kernels on CPUs that report AMX, and
# llama.cpp 0.3.36 then segfaults in ggml_backend_amx_mul_mat at the first decode. So the
# instruction sets are named one by one, each only where this CPU has it: AVX-512 code on a
# CPU without it (an AMD EPYC host of this workplace) dies with SIGILL at the first call.
# POCKETSPEC_CPU_ARGS overrides the detection (e.g. to build for another machine).
cpu_has() { grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -qx "$1"; }
portable_cpu_args() {
  if [[ -n "${POCKETSPEC_CPU_ARGS:-}" ]]; then echo "$POCKETSPEC_CPU_ARGS"; return; fi
  local args="-DGGML_NATIVE=OFF"
  local flag
  for flag in avx:AVX avx2:AVX2 fma:FMA f16c:F16C avx512f:AVX512 avx512_vnni:AVX512_VNNI; do
    if cpu_has "${flag%%:*}"; then args+=" -DGGML_${flag##*:}=ON"; else args+=" -DGGML_${flag##*:}=OFF"; fi
  done
  echo "$args"
}
PORTABLE_CPU_ARGS="$(portable_cpu_args)"

# GPU code for named architectures. Without a list, a non-native build of llama.cpp 0.3.36
# ships sm_75, sm_80 and sm_90 as PTX only (ggml/src/ggml-cuda/CMakeLists.txt), which the
# driver JIT-compiles for minutes at the first load on a T4, an A100 or an H100. Each
# architecture adds compile time: set POCKETSPEC_CUDA_ARCHITECTURES to your GPU's alone
# (e.g. 89-real for an RTX 4060) for a faster build.
# 75 T4/RTX 20, 80 A100/A30, 86 RTX 30/A10, 89 RTX 40/L4, 90 H100/H200 (+ PTX for newer GPUs),
# and with CUDA >= 12.8, 100 B200 and 120a RTX 50 (CUDA 13 dropped everything before 75).
DEFAULT_CUDA_ARCHITECTURES="75-real;80-real;86-real;89-real;90-real;90-virtual"
DEFAULT_CUDA_ARCHITECTURES_12_8="$DEFAULT_CUDA_ARCHITECTURES;100-real;120a-real"
# ROCm: MI50/MI60, MI100, MI210/MI250, MI300, RX 6000, RX 7000 (POCKETSPEC_GPU_TARGETS overrides).
DEFAULT_GPU_TARGETS="gfx906;gfx908;gfx90a;gfx942;gfx1030;gfx1100;gfx1101;gfx1102"

# The CUDA architectures to build: POCKETSPEC_CUDA_ARCHITECTURES, else the default for the nvcc on PATH.
cuda_architectures() {
  if [[ -n "${POCKETSPEC_CUDA_ARCHITECTURES:-}" ]]; then
    echo "$POCKETSPEC_CUDA_ARCHITECTURES"
    return
  fi
  local release
  release="$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')"
  if [[ -n "$release" ]] && printf '12.8\n%s\n' "$release" | sort -V -C; then
    echo "$DEFAULT_CUDA_ARCHITECTURES_12_8"
  else
    echo "$DEFAULT_CUDA_ARCHITECTURES"
  fi
}

# Prints the CMake arguments for one accelerator (cpu|cuda|rocm|vulkan); an unknown one
# gives one line on stderr and status 2.
llama_cmake_args() {
  case "$1" in
    cpu) echo "$PORTABLE_CPU_ARGS" ;;
    cuda) echo "$PORTABLE_CPU_ARGS -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$(cuda_architectures)" ;;
    rocm) echo "$PORTABLE_CPU_ARGS -DGGML_HIP=on -DGPU_TARGETS=${POCKETSPEC_GPU_TARGETS:-$DEFAULT_GPU_TARGETS}" ;;
    vulkan) echo "$PORTABLE_CPU_ARGS -DGGML_VULKAN=on" ;;
    *) echo "error: POCKETSPEC_ACCEL='$1' is not one of cpu, cuda, rocm, vulkan" >&2; return 2 ;;
  esac
}

# download_bindings_source PIP DIR: downloads llama-cpp-python's sdist into DIR, unpacks it there and
# prints the unpacked folder. Only the bindings come as source: --no-binary :all: reaches the build
# environment in which pip reads the sdist's metadata, so pip built scikit-build-core and setuptools from
# source too, and setuptools 84.2.1's source does not build ("No module named
# '_distutils_hack.override'", a fresh machine on 2026-12-02).
download_bindings_source() {
  local pip="$1" dir="$2"
  "$pip" download -q --no-deps --no-binary llama-cpp-python -d "$dir" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2 || return 1
  tar -xzf "$dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$dir" || return 1
  echo "$dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
}

# PocketSpec's patch to ggml's CPU backend, applied to the Python bindings' build (not to llama.cpp's
# own tools, which stay llama.cpp's): verify batches of up to 32 rows computed row for row as
# one-token decoding computes them (native/README.md). POCKETSPEC_ROW_EXACT_PATCH=0 builds without it.
ROW_EXACT_PATCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/patches/row-exact-verify.patch"
# "none", or the patch's content hash: it names the wheel and goes into the stamp
row_exact_patch_id() {
  if [[ "${POCKETSPEC_ROW_EXACT_PATCH:-1}" == "0" ]]; then echo none; else sha256sum "$ROW_EXACT_PATCH" | cut -c1-12; fi
}

# stamp_matches PYTHON STAMP KEY=VALUE...: status 0 when the JSON stamp exists and holds every pair.
stamp_matches() {
  local python="$1" stamp="$2"
  shift 2
  [[ -f "$stamp" ]] && "$python" - "$stamp" "$@" <<'PY'
import json, sys
stamp = json.load(open(sys.argv[1]))
sys.exit(0 if all(stamp.get(key) == value for key, _, value in (pair.partition("=") for pair in sys.argv[2:])) else 1)
PY
}

# write_stamp PYTHON STAMP KEY=VALUE...: writes the pairs and the build time as JSON, atomically.
write_stamp() {
  local python="$1" stamp="$2"
  shift 2
  "$python" - "$stamp" "$@" <<'PY'
import datetime, json, os, sys
path = sys.argv[1]
stamp = {key: value for key, _, value in (pair.partition("=") for pair in sys.argv[2:])}
stamp["built_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
with open(path + ".partial", "w") as file:
    json.dump(stamp, file, indent=2)
os.replace(path + ".partial", path)
PY
}
