#!/usr/bin/env bash
# Builds llama.cpp's own `llama-speculative-simple`, `llama-bench` and `llama-server`, the
# peers that `pocketspec bench` and benchmarks/serve_bench.py run, from the llama.cpp source
# vendored in the llama-cpp-python sdist, with the same version and portable flags as
# native/build_llama_cpp.sh.
#
#   POCKETSPEC_ACCEL=cpu|cuda|rocm|vulkan native/build_llama_tools.sh [path/to/venv/bin/pip]
#
# Installs into $POCKETSPEC_HOME/llama-tools/<version>-<accel>/ (POCKETSPEC_HOME defaults
# to ~/.cache/pocketspec) with a stamp build.json, and skips the build when that stamp
# names the same version and CMake arguments. POCKETSPEC_FORCE_REBUILD=1 rebuilds.
# POCKETSPEC_TOOLS_ROW_EXACT=1 builds llama-bench alone with PocketSpec's row-exact patch into
# <version>-<accel>-row-exact/: the same kernels as PocketSpec's verify, for
# benchmarks/calibration_check.py to compare its calibration with (the peers stay stock llama.cpp).
# About 10 minutes on 2 cores (longer with the server: about 40 minutes here on a busy machine).
set -euo pipefail

source "$(dirname "$0")/llama_build.sh"
PIP="${1:-.venv/bin/pip}"
ACCEL="${POCKETSPEC_ACCEL:-cpu}"
CMAKE_ARGS="$(llama_cmake_args "$ACCEL")" || exit 2
TOOLS=(llama-speculative-simple llama-bench llama-server)
DEST="${POCKETSPEC_HOME:-$HOME/.cache/pocketspec}/llama-tools/$LLAMA_CPP_PYTHON_VERSION-$ACCEL"
PATCH_ID=none
STAMP_PAIRS=("version=$LLAMA_CPP_PYTHON_VERSION" "cmake_args=$CMAKE_ARGS")
if [[ "${POCKETSPEC_TOOLS_ROW_EXACT:-0}" == "1" ]]; then
  TOOLS=(llama-bench)
  DEST="$DEST-row-exact"
  PATCH_ID="$(row_exact_patch_id)"
  STAMP_PAIRS+=("patch=$PATCH_ID")
fi
STAMP="$DEST/build.json"

if [[ ! -x "$PIP" ]]; then
  echo "error: pip '$PIP' not found; pass the venv's pip as the first argument" >&2
  exit 2
fi
PYTHON="$(dirname "$PIP")/python"

already_built() {
  [[ "${POCKETSPEC_FORCE_REBUILD:-0}" != "1" ]] || return 1
  for tool in "${TOOLS[@]}"; do [[ -x "$DEST/bin/$tool" ]] || return 1; done
  stamp_matches "$PYTHON" "$STAMP" "${STAMP_PAIRS[@]}"
}

if already_built; then
  echo "llama.cpp tools $LLAMA_CPP_PYTHON_VERSION ($ACCEL) are already built in $DEST; nothing to do"
  exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "building ${TOOLS[*]} from llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's llama.cpp for $ACCEL into $DEST"
echo "CMAKE_ARGS=$CMAKE_ARGS"
BINDINGS="$(download_bindings_source "$PIP" "$WORK")"
SOURCE="$BINDINGS/vendor/llama.cpp"
if [[ "$PATCH_ID" != none ]]; then
  echo "applying native/patches/row-exact-verify.patch ($PATCH_ID)"
  patch -p1 --forward --silent -d "$BINDINGS" < "$ROW_EXACT_PATCH"
fi

# Static libraries make each binary self-contained; the tests and HTTPS download
# support are not needed for local GGUF files. llama-server is driven over its API alone: no
# web UI, so the build does not try to download one (LLAMA_USE_PREBUILT_UI fetches it from
# Hugging Face, which fails, after its timeouts, on a machine without that access).
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of words
cmake -S "$SOURCE" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF $CMAKE_ARGS
cmake --build "$WORK/build" --config Release -j "$(nproc)" --target "${TOOLS[@]}"

mkdir -p "$DEST/bin"
for tool in "${TOOLS[@]}"; do
  install -m 755 "$WORK/build/bin/$tool" "$DEST/bin/$tool.partial"
  mv "$DEST/bin/$tool.partial" "$DEST/bin/$tool"
done
"$DEST/bin/llama-bench" --help >/dev/null || { echo "error: llama-bench does not run after the build" >&2; exit 1; }

write_stamp "$PYTHON" "$STAMP" "source=llama-cpp-python sdist, vendor/llama.cpp" "accel=$ACCEL" "${STAMP_PAIRS[@]}"
echo "done: ${TOOLS[*]} in $DEST/bin, stamp $STAMP"
