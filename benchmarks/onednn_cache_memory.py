"""What oneDNN's kernel caches hold on a CPU with bf16 torch weights, bounded as PocketSpec runs them and at
torch's own default, against the plan's onednn_kernels term.

    .venv/bin/python benchmarks/onednn_cache_memory.py [--model smollm2-135m-instruct] [--widths 128]
                                                      [--threads 2] [--name onednn_cache_memory]

Each cache size runs in a fresh process of its own (benchmarks/worker_process.py): it loads the model with
bf16 weights, runs one forward of one row, then one forward of every width from 2 to --widths (each a new
input shape for every linear, as verify widths and the last chunks of prompts are in a long run), and
again. It records the process's resident memory after the first forward, after the widths and after
the second pass, and the milliseconds the second pass took per forward (cached kernels, or rebuilt ones
where the bound evicted them). Beside them: memplanner.torch_peak's term for the cached kernels.
Results: benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from results_files import write_results
from worker_process import answer_if_worker, run_worker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TORCH_DEFAULT_CACHE = 1024  # ideep's and oneDNN's own capacity, each
MIB = 2**20


def worker(config: dict) -> dict:
    import pocketspec.torch_model.onednn_caches as onednn_caches
    from pocketspec.backends.torch_backend import TorchBackend
    from pocketspec.models.catalog import model_path
    from pocketspec.settings import ModelSettings
    from pocketspec.stats import vm_rss_bytes

    for name in onednn_caches.CACHE_VARIABLES:  # load_model would keep a smaller bound the environment gave
        os.environ.pop(name, None)
    onednn_caches.ONEDNN_CACHED_PRIMITIVES = config["cache_entries"]  # read by load_model
    settings = ModelSettings(backend="torch", weights="bf16", max_context=config["widths"] + 1, max_logits_rows=1,
                             n_batch=config["widths"], num_threads=config["threads"])
    backend = TorchBackend.open(model_path(config["model"]), settings)
    tokens = [(17 * index + 5) % (backend.vocab_size - 3) + 3 for index in range(config["widths"])]
    backend.forward(tokens[:1], [0])
    after_first = vm_rss_bytes("self")
    widths = range(2, config["widths"] + 1)
    for width in widths:
        backend.rollback(0)
        backend.forward(tokens[:width], [width - 1])
    after_widths = vm_rss_bytes("self")
    started = time.perf_counter()
    for width in widths:
        backend.rollback(0)
        backend.forward(tokens[:width], [width - 1])
    second_pass_ms = 1000 * (time.perf_counter() - started) / len(widths)
    return {"cache_entries": config["cache_entries"], "after_first_forward_bytes": after_first,
            "after_widths_bytes": after_widths, "after_second_pass_bytes": vm_rss_bytes("self"),
            "second_pass_ms_per_forward": second_pass_ms}


def markdown(results: dict) -> str:
    lines = [f"# oneDNN kernel caches, bf16 {results['model']} on a CPU", "",
             f"{results['cpu']}, torch {results['torch']}, {results['threads']} threads, widths 1-{results['widths']}. "
             f"The plan's onednn_kernels term: {results['planned_bytes'] / MIB:.1f} MiB.", "",
             "| cache entries | resident after one row (MiB) | after every width | growth | after a second pass "
             "| second pass, ms per forward |",
             "|---|---|---|---|---|---|"]
    for row in results["rows"]:
        growth = (row["after_widths_bytes"] - row["after_first_forward_bytes"]) / MIB
        lines.append(f"| {row['cache_entries']} | {row['after_first_forward_bytes'] / MIB:.1f} "
                     f"| {row['after_widths_bytes'] / MIB:.1f} | {growth:.1f} "
                     f"| {row['after_second_pass_bytes'] / MIB:.1f} | {row['second_pass_ms_per_forward']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    answer_if_worker(worker)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--widths", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="onednn_cache_memory")
    args = parser.parse_args()
    import torch

    from memplanner.torch_peak import ONEDNN_CACHED_PRIMITIVES, ONEDNN_PRIMITIVE_BYTES
    from pocketspec.machine_report import cpu_name

    rows = [run_worker(__file__, {"model": args.model, "widths": args.widths, "threads": args.threads,
                                  "cache_entries": entries}, what=f"{entries} cache entries")
            for entries in (ONEDNN_CACHED_PRIMITIVES, TORCH_DEFAULT_CACHE)]
    results = {"model": args.model, "widths": args.widths, "threads": args.threads, "torch": torch.__version__,
               "cpu": cpu_name(),
               "planned_bytes": ONEDNN_CACHED_PRIMITIVES * ONEDNN_PRIMITIVE_BYTES, "rows": rows}
    write_results(args.name, results, markdown(results))


if __name__ == "__main__":
    main()
