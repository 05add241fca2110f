"""Load time and peak memory of a GGUF mapped (mmap) or read (no mmap), on a cold and a warm page cache.

    .venv/bin/python benchmarks/mmap_load.py [--model qwen2.5-coder-1.5b-instruct] [--repeats 2]

With llama.cpp's CPU repacking, a mapped GGUF keeps the file's pages of the repacked tensors
resident beside their repacked copy; read without mmap, each tensor exists once (issue 14).
Each run is a fresh process: it loads the model with repacking on, creates a 512-token
context, decodes 16 tokens one by one, and reports the load seconds and its VmHWM, RssFile
and RssAnon. A cold run first drops the page cache (`sync; echo 3 > /proc/sys/vm/drop_caches`,
root only; otherwise cold runs are skipped and the results say so).
Results: benchmarks/results/mmap_load.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from worker_process import answer_if_worker, run_worker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DECODE_TOKENS = 16
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def worker(config: dict) -> dict:
    """Runs in a fresh process: one load of config["model_path"], mapped or read (config["use_mmap"])."""
    import llama_cpp

    quiet = llama_cpp.llama_log_callback(lambda level, text, user_data: None)  # kept alive while loading
    llama_cpp.llama_log_set(quiet, None)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers, params.use_extra_bufts = 0, True
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if config["use_mmap"] else llama_cpp.LLAMA_LOAD_MODE_NONE
    started = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(config["model_path"].encode(), params)
    load_seconds = time.perf_counter() - started
    context_params = llama_cpp.llama_context_default_params()
    context_params.n_ctx, context_params.n_batch, context_params.n_ubatch = 512, 512, 512
    context = llama_cpp.llama_init_from_model(model, context_params)
    batch = llama_cpp.llama_batch_init(1, 0, 1)
    for position in range(DECODE_TOKENS):
        batch.n_tokens = 1
        batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = 100 + position, position, 1, 0, 1
        llama_cpp.llama_decode(context, batch)
    found = {"load_seconds": round(load_seconds, 3), "vm_hwm_bytes": _status_bytes("VmHWM"),
             "rss_file_bytes": _status_bytes("RssFile"), "rss_anon_bytes": _status_bytes("RssAnon")}
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(context)
    llama_cpp.llama_model_free(model)
    return found


def drop_page_cache() -> bool:
    try:
        os.sync()
        DROP_CACHES.write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    answer_if_worker(worker)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from apps.report import write_results
    from pocketspec.models.catalog import model_path

    path = str(model_path(args.model))
    records, can_drop = [], drop_page_cache()
    for repeat in range(args.repeats):
        for cache in ("cold", "warm") if can_drop else ("warm",):
            for mode in ("mmap", "no-mmap"):
                config = {"model_path": path, "use_mmap": mode == "mmap"}
                if cache == "cold":
                    drop_page_cache()
                else:  # warm: the file was just read by a load of its own
                    run_worker(__file__, config, what=f"{mode} warm-up worker")
                record = {"model": args.model, "mode": mode, "cache": cache, "repeat": repeat,
                          **run_worker(__file__, config, what=f"{mode} worker")}
                records.append(record)
                print(record, file=sys.stderr)
    mib = 2**20
    rows = [[r["mode"], r["cache"], r["repeat"], r["load_seconds"], round(r["vm_hwm_bytes"] / mib, 1),
             round(r["rss_file_bytes"] / mib, 1), round(r["rss_anon_bytes"] / mib, 1)] for r in records]
    notes = [f"{args.model}, repacking on, 512-token context, {DECODE_TOKENS} tokens decoded; one process per run",
             "the machine is shared with other jobs: load times vary with their disk and CPU use",
             "cold = page cache dropped before the run" if can_drop else "cold runs skipped: not root"]
    _, markdown = write_results(ROOT / "benchmarks" / "results", "mmap_load", {"records": records},
                                "Loading mapped vs read", ["mode", "page cache", "repeat", "load s", "VmHWM MiB",
                                                           "RssFile MiB", "RssAnon MiB"], rows, notes)
    print(markdown.read_text())


if __name__ == "__main__":
    main()
