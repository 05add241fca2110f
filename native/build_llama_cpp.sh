#!/usr/bin/env bash
# Builds llama-cpp-python with portable flags for one accelerator into a venv.
#
#   POCKETSPEC_ACCEL=cpu|cuda|rocm|vulkan native/build_llama_cpp.sh [path/to/venv/bin/pip]
#
# Skips the build when the same version and accelerator (same CMake args) is already
# installed there, per the stamp <venv>/pocketspec-llama-build.json that it writes and
# that `pocketspec doctor` reads. POCKETSPEC_FORCE_REBUILD=1 rebuilds without pip's cache.
set -euo pipefail

source "$(dirname "$0")/llama_build.sh"
PIP="${1:-.venv/bin/pip}"
ACCEL="${POCKETSPEC_ACCEL:-cpu}"
CMAKE_ARGS="$(llama_cmake_args "$ACCEL")" || exit 2

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

INSTALLED="$(installed_version)"
if [[ "$INSTALLED" == "$LLAMA_CPP_PYTHON_VERSION" && "${POCKETSPEC_FORCE_REBUILD:-0}" != "1" ]] && stamp_matches "$PYTHON" "$STAMP" \
    "version=$LLAMA_CPP_PYTHON_VERSION" "accel=$ACCEL" "cmake_args=$CMAKE_ARGS"; then
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

write_stamp "$PYTHON" "$STAMP" package=llama-cpp-python "version=$LLAMA_CPP_PYTHON_VERSION" "accel=$ACCEL" \
  "cmake_args=$CMAKE_ARGS"
echo "done: stamp written to $STAMP"
