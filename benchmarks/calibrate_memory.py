"""Measures llama.cpp's CPU memory terms on the real models and fits memplanner's constants.

    .venv/bin/python benchmarks/calibrate_memory.py            # measure, then fit
    .venv/bin/python benchmarks/calibrate_memory.py --fit-only benchmarks/results/memory_calibration.json

Each model is measured in a fresh worker process, so its RSS starts from the same
base as the CLI's (its Python modules imported, no backend library, no model). A worker
loads the model once, as the runtime does (read without mmap where its weights are
repacked: memplanner.terms.loads_without_mmap), creates many contexts over a grid of
n_ctx / n_ubatch / n_outputs_max / flash-attention settings and reads the buffer sizes
llama.cpp logs at context creation ("KV buffer size", "compute buffer size", "output
buffer size"). It then holds one context, decodes into it and records RSS and its
high-water mark. Raw observations go to benchmarks/results/memory_calibration.json;
the fit (benchmarks/fit_memory.py) writes memplanner/constants.py.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import re
import sys
import time
from pathlib import Path

import psutil

from worker_process import WorkerFailed, answer_if_worker, run_worker

ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = Path(os.environ.get("POCKETSPEC_HOME", Path.home() / ".cache" / "pocketspec")) / "models"
RESULTS = ROOT / "benchmarks" / "results" / "memory_calibration.json"
MIB = 1024 * 1024
BUFFER_LINE = re.compile(r"(\S+)\s+(KV|compute|output|model) buffer size\s*=\s*([\d.]+) MiB")
CELLS_LINE = re.compile(r"\(\s*(\d+) cells")
EFFECTIVE_LINE = re.compile(r"llama_context: (n_ctx|n_batch|n_ubatch|n_outputs_max)\s+=\s+(\d+)")

# (model, n_ctx values, n_ubatch values, n_outputs_max values, flash-attention types)
GRIDS = {
    "smollm2-135m-instruct": ([256, 1024, 2048, 4096], [64, 128, 512], [1, 9, 0], [0, 1]),
    "qwen2.5-coder-0.5b-instruct": ([256, 1024, 2048, 4096], [64, 128, 512], [1, 9, 0], [0, 1]),
    "qwen2.5-coder-1.5b-instruct": ([1024, 4096], [64, 512], [1, 0], [0, 1]),
}
ODD_CONTEXTS = [300, 1000, 4105]  # to see how llama.cpp pads n_ctx
DECODE_TOKENS = {"smollm2-135m-instruct": 1024, "qwen2.5-coder-0.5b-instruct": 1024, "qwen2.5-coder-1.5b-instruct": 64}


def rss_bytes() -> dict[str, int]:
    status = Path("/proc/self/status").read_text()
    peak = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
    return {"rss": psutil.Process().memory_info().rss, "rss_peak": peak}


class LogCapture:
    """Collects llama.cpp log text; one callback kept alive for the whole process."""

    def __init__(self, llama_cpp) -> None:
        self.lines: list[str] = []
        self._partial = ""

        @llama_cpp.llama_log_callback
        def _callback(level, text, user_data):
            self._partial += text.decode("utf-8", errors="replace")
            while "\n" in self._partial:
                line, self._partial = self._partial.split("\n", 1)
                self.lines.append(line)

        self._callback = _callback
        llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


def parse_buffers(lines: list[str]) -> dict[str, float]:
    """Logged buffer sizes by kind ('KV', 'compute', 'output', 'model:<buffer>') in MiB, and the
    effective n_ctx / n_batch / n_ubatch / n_outputs_max / KV cells llama.cpp settled on."""
    sizes: dict[str, float] = {}
    for line in lines:
        for buffer, kind, mib in BUFFER_LINE.findall(line):
            name = f"model:{buffer}" if kind == "model" else kind
            sizes[name] = sizes.get(name, 0.0) + float(mib)
        effective = EFFECTIVE_LINE.search(line)
        if effective:
            sizes[effective.group(1)] = int(effective.group(2))
        cells = CELLS_LINE.search(line)
        if cells and "llama_kv_cache" in line:
            sizes["kv_cells"] = int(cells.group(1))
    return sizes


def make_context(llama_cpp, model, n_ctx, n_ubatch, n_outputs_max, flash_attn, kv_type=1):
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_ubatch, n_ubatch
    # n_outputs_max_per_seq defaults to 1; 0 makes it follow n_outputs_max (0 itself means n_batch)
    params.n_seq_max, params.n_outputs_max, params.n_outputs_max_per_seq = 1, n_outputs_max, 0
    params.n_threads = params.n_threads_batch = 2
    params.flash_attn_type = flash_attn
    params.type_k = params.type_v = kv_type
    params.no_perf = True
    return llama_cpp.llama_init_from_model(model, params)


def decode(llama_cpp, context, num_tokens: int, n_ubatch: int) -> None:
    """Decodes num_tokens arbitrary tokens in n_ubatch chunks, logits at every position."""
    batch = llama_cpp.llama_batch_init(n_ubatch, 0, 1)
    for start in range(0, num_tokens, n_ubatch):
        count = min(n_ubatch, num_tokens - start)
        batch.n_tokens = count
        for index in range(count):
            batch.token[index] = 100 + (start + index) % 1000
            batch.pos[index] = start + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = 0
            batch.logits[index] = 1
        if llama_cpp.llama_decode(context, batch) != 0:
            raise RuntimeError(f"llama_decode failed at {start}")
    llama_cpp.llama_batch_free(batch)


def worker(config: dict) -> dict:
    """Runs in a fresh process: every measurement for one model (config: {"model": name})."""
    name = config["model"]
    record: dict = {"model": name, "file_bytes": (MODELS_DIR / f"{name}.gguf").stat().st_size}
    record["rss_interpreter"] = rss_bytes()
    # The baseline `generate --json` measures from: the CLI's own modules (numpy, gguf, click,
    # jinja2) are loaded, the backend library and models are not. Overhead is what comes after.
    sys.path.insert(0, str(ROOT))
    import apps.cli  # noqa: F401

    record["rss_baseline"] = rss_bytes()
    import llama_cpp

    logs = LogCapture(llama_cpp)
    llama_cpp.llama_backend_init()
    record["rss_runtime"] = rss_bytes()
    from memplanner.shapes import shape_from_gguf
    from memplanner.terms import loads_without_mmap

    model_params = llama_cpp.llama_model_default_params()
    model_params.n_gpu_layers = 0
    if loads_without_mmap(shape_from_gguf(MODELS_DIR / f"{name}.gguf"), "cpu", True):
        model_params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
    record["use_mmap"] = model_params.load_mode != llama_cpp.LLAMA_LOAD_MODE_NONE
    started = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(str(MODELS_DIR / f"{name}.gguf").encode(), model_params)
    record["load_seconds"] = time.perf_counter() - started
    record["rss_loaded"] = rss_bytes()
    record["model_buffers"] = parse_buffers(logs.take())
    contexts = []
    n_ctxs, n_ubatches, n_outputs, flash = GRIDS[name]
    settings = [(c, u, o, f, 1) for c, u, o, f in itertools.product(n_ctxs, n_ubatches, n_outputs, flash)]
    settings += [(c, 512, 9, -1, 1) for c in ODD_CONTEXTS]  # flash attention auto, as the runtime
    settings += [(1024, 512, 9, 1, kv) for kv in (8, 2)]  # q8_0 and q4_0 KV need flash attention
    for n_ctx, n_ubatch, n_outputs_max, flash_attn, kv_type in settings:
        context = make_context(llama_cpp, model, n_ctx, n_ubatch, n_outputs_max, flash_attn, kv_type)
        lines = logs.take()
        if not context:
            contexts.append({"n_ctx": n_ctx, "failed": True, "log": lines[-3:]})
            continue
        llama_cpp.llama_free(context)
        contexts.append({
            "n_ctx": n_ctx, "n_ubatch": n_ubatch, "n_outputs_max": n_outputs_max, "flash_attn": flash_attn,
            "kv_type": kv_type, "buffers_mib": parse_buffers(lines),
            "flash_log": [line.strip() for line in lines if "flash_attn" in line][:2],
        })
        logs.take()
    record["contexts"] = contexts
    record["rss_after_grid"] = rss_bytes()
    num_tokens = DECODE_TOKENS[name]
    context = make_context(llama_cpp, model, 1024, 512, 0, -1)
    record["held_context"] = {"n_ctx": 1024, "n_ubatch": 512, "n_outputs_max": 0, "flash_attn": -1,
                              "buffers_mib": parse_buffers(logs.take()), "rss_created": rss_bytes()}
    started = time.perf_counter()
    decode(llama_cpp, context, num_tokens, 512)
    record["held_context"].update(decoded_tokens=num_tokens, decode_seconds=time.perf_counter() - started,
                                  rss_decoded=rss_bytes())
    llama_cpp.llama_free(context)
    llama_cpp.llama_model_free(model)
    return record


def measure() -> dict:
    import llama_cpp  # only to record the version; workers do the measuring

    records = []
    for name in GRIDS:
        if not (MODELS_DIR / f"{name}.gguf").exists():
            print(f"skipping {name}: not in {MODELS_DIR}", file=sys.stderr)
            continue
        started = time.perf_counter()
        try:
            records.append(run_worker(__file__, {"model": name}, what=f"{name} worker"))
        except WorkerFailed as failure:
            records.append({"model": name, "failed": failure.returncode, "stderr": failure.stderr[-2000:]})
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d"), "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "cpu_count": os.cpu_count(), "models": records}


def main() -> None:
    answer_if_worker(worker)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-only", type=Path, help="fit from an existing observations JSON")
    args = parser.parse_args()
    if args.fit_only:
        observations = json.loads(args.fit_only.read_text())
    else:
        observations = measure()
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(observations, indent=1))
        print(f"wrote {RESULTS}", file=sys.stderr)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fit_memory import fit_and_write  # noqa: E402

    fit_and_write(observations, MODELS_DIR)


if __name__ == "__main__":
    main()
