#!/usr/bin/env bash
# Builds llama-cpp-python with portable flags for one accelerator into a venv.
#
#   POCKETSPEC_ACCEL=cpu|cuda|rocm|vulkan native/build_llama_cpp.sh [--wheel-only] [path/to/venv/bin/pip]
#
# --wheel-only compiles the wheel into POCKETSPEC_HOME/wheels and leaves the venv as it is, so that
# pip can install the rest into it meanwhile (the Makefile's setup); a second call installs it.
# Skips the build when the same version and accelerator (same CMake args) is already
# installed there, per the stamp <venv>/pocketspec-llama-build.json that it writes and
# that `pocketspec doctor` reads. POCKETSPEC_FORCE_REBUILD=1 rebuilds without pip's cache.
set -euo pipefail

source "$(dirname "$0")/llama_build.sh"
WHEEL_ONLY=0
if [[ "${1:-}" == "--wheel-only" ]]; then
  WHEEL_ONLY=1
  shift
fi
PIP="${1:-.venv/bin/pip}"
ACCEL="${POCKETSPEC_ACCEL:-cpu}"
CMAKE_ARGS="$(llama_cmake_args "$ACCEL")" || exit 2
# The bindings' multimodal library (mtmd, LLAVA_BUILD), which PocketSpec never loads: leaving it out
# cut the 2-core Xeon's build from 6-7 minutes to 5 min 14 s (2026-12-02). So is llama.cpp's common
# library (libllama-common), which only mtmd and llama.cpp's own tools use; the bindings' CMakeLists
# forces it on, and without_forced_common_library lets this flag leave it out. The libraries the bindings
# load come out byte for byte the same, and the 2-core EPYC Zen 3 built the wheel in 4 min 2 s instead
# of 8 min 12 s (2026-12-02).
CMAKE_ARGS="$CMAKE_ARGS -DLLAVA_BUILD=OFF -DLLAMA_BUILD_COMMON=OFF"
PATCH_ID="$(row_exact_patch_id)"
# What the wheel leaves out (scikit-build-core's wheel.exclude: gitignore patterns on the wheel's paths). A
# wheel holds no symlinks, so each library came three times (.so, .so.0, .so.0.25.3), and llama.cpp's own
# install rules added a second set and its headers at the top of site-packages (lib/, include/): 38 MB of
# libraries in the CPU wheel for 6.4 MB of code, and six copies of a GPU backend. Kept: libllama.so and
# libggml.so, which the bindings open by those names, and each library's soname file (libggml-cpu.so.0, ...),
# by which the others link to it and ggml_ops opens it.
WHEEL_EXCLUDE="/lib/;/include/;llama_cpp/lib/*.so.*.*;llama_cpp/lib/libllama.so.*;llama_cpp/lib/libggml-*.so"

if [[ ! -x "$PIP" ]]; then
  echo "error: pip '$PIP' not found; pass the venv's pip as the first argument" >&2
  exit 2
fi
PYTHON="$(dirname "$PIP")/python"
VENV="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
STAMP="$VENV/pocketspec-llama-build.json"

# The bindings' CMakeLists sets LLAMA_BUILD_COMMON with FORCE, over any -D: drop the FORCE, so that the
# cache value from CMAKE_ARGS decides. A source in which the line is not found stops the build.
without_forced_common_library() {
  local cmake_lists="$1/CMakeLists.txt"
  local forced='set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)'
  if ! grep -qF "$forced" "$cmake_lists"; then
    echo "error: $cmake_lists no longer forces LLAMA_BUILD_COMMON as native/build_llama_cpp.sh expects" >&2
    exit 1
  fi
  sed -i 's/^\( *set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library"\) FORCE)$/\1)/' "$cmake_lists"
  if grep -qF "$forced" "$cmake_lists"; then
    echo "error: could not unforce LLAMA_BUILD_COMMON in $cmake_lists" >&2
    exit 1
  fi
}

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
    "version=$LLAMA_CPP_PYTHON_VERSION" "accel=$ACCEL" "cmake_args=$CMAKE_ARGS" "patch=$PATCH_ID" \
    "wheel_exclude=$WHEEL_EXCLUDE"; then
  echo "llama-cpp-python $INSTALLED ($ACCEL) is already built in $VENV; nothing to do"
  exit 0
fi

# pip's own cache keeps one wheel per version whatever CMAKE_ARGS built it, so a wheel built
# for another CPU (or the CPU build, for a GPU) would come back. Built wheels are kept here
# instead, one folder per version, CMake arguments and patch.
ARGS_HASH="$(printf '%s|%s' "$CMAKE_ARGS" "$WHEEL_EXCLUDE" | sha1sum | cut -c1-12)"
if [[ "$PATCH_ID" != none ]]; then ARGS_HASH="$ARGS_HASH-patch-$PATCH_ID"; fi
WHEEL_DIR="${POCKETSPEC_HOME:-$HOME/.cache/pocketspec}/wheels/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-$ACCEL-$ARGS_HASH"
if [[ "${POCKETSPEC_FORCE_REBUILD:-0}" == "1" ]]; then
  rm -rf "$WHEEL_DIR"
fi
if ! compgen -G "$WHEEL_DIR/llama_cpp_python-*.whl" > /dev/null; then
  echo "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION for $ACCEL (the CPU build: about 4-5 minutes on 2 cores)"
  echo "CMAKE_ARGS=$CMAKE_ARGS"
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  SOURCE="$(download_bindings_source "$PIP" "$WORK")"
  without_forced_common_library "$SOURCE"
  if [[ "$PATCH_ID" != none ]]; then
    echo "applying native/patches/row-exact-verify.patch ($PATCH_ID)"
    patch -p1 --forward --silent -d "$SOURCE" < "$ROW_EXACT_PATCH"
  fi
  mkdir -p "$WHEEL_DIR.partial"
  CMAKE_ARGS="$CMAKE_ARGS" "$PIP" wheel --no-deps --no-cache-dir --config-settings="wheel.exclude=$WHEEL_EXCLUDE" \
    -w "$WHEEL_DIR.partial" "$SOURCE"
  rm -rf "$WHEEL_DIR"
  mv "$WHEEL_DIR.partial" "$WHEEL_DIR"
fi
if [[ "$WHEEL_ONLY" == 1 ]]; then
  echo "llama-cpp-python's wheel is ready in $WHEEL_DIR"
  exit 0
fi
"$PIP" install --force-reinstall --no-deps "$WHEEL_DIR"/llama_cpp_python-*.whl
"$PIP" install "$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl)"  # its dependencies, from the index
# Importing is not enough: a kernel built for instructions this CPU lacks dies at backend init.
"$PYTHON" -c "import llama_cpp; llama_cpp.llama_backend_init(); llama_cpp.llama_print_system_info()" \
  || { echo "error: llama.cpp does not start after the build (CMAKE_ARGS=$CMAKE_ARGS)" >&2; exit 1; }

write_stamp "$PYTHON" "$STAMP" package=llama-cpp-python "version=$LLAMA_CPP_PYTHON_VERSION" "accel=$ACCEL" \
  "cmake_args=$CMAKE_ARGS" "patch=$PATCH_ID" "wheel_exclude=$WHEEL_EXCLUDE"
echo "done: stamp written to $STAMP"
