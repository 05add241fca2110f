#!/usr/bin/env bash
# Builds llama-cpp-python with portable flags for one accelerator into a venv.
#
#   POCKETSPEC_ACCEL=cpu|cuda|rocm|vulkan native/build_llama_cpp.sh [path/to/venv/bin/pip]
#
# Skips the build when the same version and accelerator (same CMake args) is already
# installed there, per the stamp <venv>/pocketspec-llama-build.json that it writes and
# that `pocketspec doctor` reads. POCKETSPEC_FORCE_REBUILD=1 rebuilds without pip's cache.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
PIP="${1:-.venv/bin/pip}"
ACCEL="${POCKETSPEC_ACCEL:-cpu}"

# GGML_NATIVE=ON (the default) picks the AMX kernels on CPUs that report AMX, and
# llama.cpp 0.3.36 then segfaults in ggml_backend_amx_mul_mat at the first decode.
PORTABLE_CPU_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON"
case "$ACCEL" in
  cpu) CMAKE_ARGS="$PORTABLE_CPU_ARGS" ;;
  cuda) CMAKE_ARGS="$PORTABLE_CPU_ARGS -DGGML_CUDA=on" ;;
  rocm) CMAKE_ARGS="$PORTABLE_CPU_ARGS -DGGML_HIP=on" ;;
  vulkan) CMAKE_ARGS="$PORTABLE_CPU_ARGS -DGGML_VULKAN=on" ;;
  *) echo "error: POCKETSPEC_ACCEL='$ACCEL' is not one of cpu, cuda, rocm, vulkan" >&2; exit 2 ;;
esac

if [[ ! -x "$PIP" ]]; then
  echo "error: pip '$PIP' not found; pass the venv's pip as the first argument" >&2
  exit 2
fi
PYTHON="$(dirname "$PIP")/python"
VENV="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
STAMP="$VENV/pocketspec-llama-build.json"

installed_version() {
  "$PYTHON" - <<'PY'
import importlib.metadata
try:
    print(importlib.metadata.version("llama-cpp-python"))
except importlib.metadata.PackageNotFoundError:
    print("")
PY
}

stamp_matches() {
  [[ -f "$STAMP" ]] && STAMP="$STAMP" ACCEL="$ACCEL" CMAKE_ARGS="$CMAKE_ARGS" \
    VERSION="$LLAMA_CPP_PYTHON_VERSION" "$PYTHON" - <<'PY'
import json, os, sys
stamp = json.load(open(os.environ["STAMP"]))
same = (stamp.get("accel"), stamp.get("cmake_args"), stamp.get("version")) == (
    os.environ["ACCEL"], os.environ["CMAKE_ARGS"], os.environ["VERSION"])
sys.exit(0 if same else 1)
PY
}

INSTALLED="$(installed_version)"
if [[ "$INSTALLED" == "$LLAMA_CPP_PYTHON_VERSION" && "${POCKETSPEC_FORCE_REBUILD:-0}" != "1" ]] && stamp_matches; then
  echo "llama-cpp-python $INSTALLED ($ACCEL) is already built in $VENV; nothing to do"
  exit 0
fi

PIP_FLAGS=()
if [[ "$ACCEL" != "cpu" || "${POCKETSPEC_FORCE_REBUILD:-0}" == "1" ]]; then
  # pip caches one wheel per version whatever CMAKE_ARGS were: for a GPU build that
  # cached wheel would be the CPU one, so build from source.
  PIP_FLAGS+=(--no-cache-dir --force-reinstall --no-deps)
elif [[ -n "$INSTALLED" ]]; then
  # Installed without a matching stamp (another version or accelerator): replace it.
  PIP_FLAGS+=(--force-reinstall --no-deps)
fi

echo "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION for $ACCEL into $VENV (about 10 minutes on 2 cores)"
echo "CMAKE_ARGS=$CMAKE_ARGS"
CMAKE_ARGS="$CMAKE_ARGS" "$PIP" install ${PIP_FLAGS[@]+"${PIP_FLAGS[@]}"} "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
"$PYTHON" -c "import llama_cpp" || { echo "error: llama_cpp does not import after the build" >&2; exit 1; }

STAMP="$STAMP" ACCEL="$ACCEL" CMAKE_ARGS="$CMAKE_ARGS" VERSION="$LLAMA_CPP_PYTHON_VERSION" "$PYTHON" - <<'PY'
import datetime, json, os
stamp = {
    "package": "llama-cpp-python",
    "version": os.environ["VERSION"],
    "accel": os.environ["ACCEL"],
    "cmake_args": os.environ["CMAKE_ARGS"],
    "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
}
with open(os.environ["STAMP"] + ".partial", "w") as file:
    json.dump(stamp, file, indent=2)
os.replace(os.environ["STAMP"] + ".partial", os.environ["STAMP"])
PY
echo "done: stamp written to $STAMP"
