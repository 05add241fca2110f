# Everything a fresh machine needs: `make chat` and `make test` do all the set-up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
POCKETSPEC_ACCEL ?= cpu
export POCKETSPEC_ACCEL
# The CPU build of torch from the local wheel; set TORCH_SPEC to a CUDA/ROCm build on a GPU box.
TORCH_SPEC ?= torch==2.13.0
# ONNX Runtime for --backend onnx: the CPU package, or the CUDA one with POCKETSPEC_ACCEL=cuda
ONNX_EXTRA := $(if $(filter cuda,$(POCKETSPEC_ACCEL)),onnx-gpu,onnx)

.PHONY: chat serve test setup llama peers models-test models-default bench bench-chat bench-memory clean-venv gpu-wheels

chat: setup models-default
	$(BIN)/pocketspec chat

# The OpenAI-compatible server on the default pair, on http://127.0.0.1:8000 (docs/serve.md)
serve: setup models-default
	$(BIN)/pocketspec serve

# Two test workers (fewer on a 1-core machine), each test file on one of them; the 20 slowest tests are listed.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(2, len(os.sched_getaffinity(0))))")

test: setup models-test
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --durations=20

setup: $(VENV)/.pocketspec-installed

$(BIN)/pip:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The portable llama.cpp build, with PocketSpec's row-exact verify patch (native/build_llama_cpp.sh
# skips it when already built; the built wheel is kept in POCKETSPEC_HOME/wheels, so a new venv
# reinstalls it in seconds).
llama: $(BIN)/pip
	native/build_llama_cpp.sh $(BIN)/pip

# llama.cpp's wheel compiles (the CPU's minutes) while pip installs the rest (mostly the network's); then
# the wheel goes in.
$(VENV)/.pocketspec-installed: pyproject.toml native/build_llama_cpp.sh native/llama_build.sh \
		native/patches/row-exact-verify.patch | $(BIN)/pip
	native/build_llama_cpp.sh --wheel-only $(BIN)/pip & wheel=$$!; \
	  $(BIN)/pip install -q '$(TORCH_SPEC)' && $(BIN)/pip install -q -e '.[test,torch,bench,serve,$(ONNX_EXTRA)]'; \
	  installed=$$?; wait $$wheel && exit $$installed
	native/build_llama_cpp.sh $(BIN)/pip
	touch $@

# The models the tests load: SmolLM2 for every run, and the qwen-coder pair.
models-test: setup
	$(BIN)/pocketspec models pull smollm2-135m-instruct
	$(BIN)/pocketspec models pull qwen-coder

models-default: setup
	$(BIN)/pocketspec models pull qwen-coder

# The peers `pocketspec bench` and benchmarks/serve_bench.py compare with: llama.cpp's own
# tools, llama-server included (built once into POCKETSPEC_HOME), and the `peers` extra (transformers).
peers: setup
	native/build_llama_tools.sh $(BIN)/pip
	$(BIN)/pip install -q -e '.[peers]'

# What the GPU suite's library steps need on a GPU machine that lacks them (docs/gpu.md): the wheels, in
# .whl, for its Python 3.12 (torchao's, as the device README fetches wheels; GemLite's is pure Python,
# built here from its source). A device call carries .whl and installs it first.
GPU_WHEELS_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
gpu-wheels: setup
	rm -rf .whl && mkdir -p .whl
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_WHEELS_PLATFORMS) -d .whl torchao==0.18.0
	$(BIN)/pip wheel -q --no-deps -w .whl gemlite==0.6.0.post2

bench: setup models-test peers
	$(BIN)/python -m apps.bench

# Chat speed on MT-Bench (plain vs speculative), and the memory plan against measured peaks:
# benchmarks/results/chat_bench.* and memory_grid.* (each script's docstring has its flags).
bench-chat: setup models-test
	$(BIN)/python benchmarks/chat_bench.py

bench-memory: setup models-test
	$(BIN)/python benchmarks/memory_grid.py

clean-venv:
	rm -rf $(VENV)
