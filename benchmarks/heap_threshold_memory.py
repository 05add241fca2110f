"""What glibc's heap keeps of torch's freed activations on a CPU, with its own mmap threshold (raised as
buffers are freed) and with PocketSpec's fixed one (pocketspec/torch_model/glibc_heap.py), and what each
costs in speed.

    .venv/bin/python benchmarks/heap_threshold_memory.py [--model smollm2-135m-instruct]
                                                         [--weights int8,fp32,bf16,int4] [--rounds 2]
                                                         [--threads 2] [--name heap_threshold_memory]

Each weights format and threshold runs in a fresh process of its own (benchmarks/worker_process.py), the
two thresholds alternating, --rounds times. A worker loads the model, prefills 512 tokens in chunks of
128 (timed), runs one forward of every width from 1 to 128 (each width a new size for every activation,
as verify widths and the last chunks of prompts are in a long run), and records how much its resident
memory grew since the loading (the KV pages written count alike under both thresholds); then times
verify-like forwards of mixed widths (1-32) at depth 512.
Results: benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from results_files import write_results
from worker_process import answer_if_worker, run_worker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 2**20
PREFILL_TOKENS, PREFILL_CHUNK, MAX_WIDTH = 512, 128, 128
MIXED_WIDTHS = (1, 1, 4, 1, 8, 16, 2, 1, 24, 32, 3, 1) * 3


def worker(config: dict) -> dict:
    import pocketspec.torch_model.load as load
    from pocketspec.backends.torch_backend import TorchBackend
    from pocketspec.models.catalog import model_path
    from pocketspec.settings import ModelSettings
    from pocketspec.stats import vm_rss_bytes

    if not config["fixed"]:
        load.fix_mmap_threshold = lambda: None  # glibc's own threshold, raised as buffers are freed
    settings = ModelSettings(backend="torch", weights=config["weights"], max_context=PREFILL_TOKENS + MAX_WIDTH + 1,
                             max_logits_rows=max(MIXED_WIDTHS) + 1, n_batch=PREFILL_CHUNK,
                             num_threads=config["threads"])
    backend = TorchBackend.open(model_path(config["model"]), settings)
    tokens = [(17 * index + 5) % (backend.vocab_size - 3) + 3 for index in range(PREFILL_TOKENS + MAX_WIDTH)]
    after_load = vm_rss_bytes("self")
    started = time.perf_counter()
    for start in range(0, PREFILL_TOKENS, PREFILL_CHUNK):
        backend.forward(tokens[start:start + PREFILL_CHUNK], [PREFILL_CHUNK - 1])
    prefill_seconds = time.perf_counter() - started
    for width in range(1, MAX_WIDTH + 1):
        backend.rollback(PREFILL_TOKENS)
        backend.forward(tokens[PREFILL_TOKENS:PREFILL_TOKENS + width], [width - 1])
    after_widths = vm_rss_bytes("self")
    started = time.perf_counter()
    for width in MIXED_WIDTHS:
        backend.rollback(PREFILL_TOKENS)
        backend.forward(tokens[PREFILL_TOKENS:PREFILL_TOKENS + width], list(range(width)))
    verify_ms = 1000 * (time.perf_counter() - started) / len(MIXED_WIDTHS)
    return {"weights": config["weights"], "fixed": config["fixed"], "prefill_seconds": prefill_seconds,
            "after_load_bytes": after_load, "after_widths_bytes": after_widths,
            "verify_ms_per_forward": verify_ms}


def summary(rows: list[dict]) -> list[dict]:
    """Per format and threshold: the median over rounds of each figure, and the growth's range."""
    found = []
    for weights in dict.fromkeys(row["weights"] for row in rows):
        for fixed in (False, True):
            runs = [row for row in rows if row["weights"] == weights and row["fixed"] == fixed]
            growths = [(row["after_widths_bytes"] - row["after_load_bytes"]) / MIB for row in runs]
            found.append({"weights": weights, "fixed": fixed, "growth_mib": growths,
                          "after_widths_mib": statistics.median(row["after_widths_bytes"] / MIB for row in runs),
                          "prefill_seconds": statistics.median(row["prefill_seconds"] for row in runs),
                          "verify_ms_per_forward": statistics.median(row["verify_ms_per_forward"] for row in runs)})
    return found


def markdown(results: dict) -> str:
    lines = [f"# glibc's mmap threshold and torch's activations, {results['model']} on a CPU", "",
             f"{results['cpu']}, torch {results['torch']}, {results['threads']} threads, {results['rounds']} rounds "
             f"(fresh processes, the thresholds alternating); medians, growth as every round's figure.", "",
             "| weights | threshold | growth since loading (MiB) | resident after (MiB) | prefill 512 (s) "
             "| verify, ms per forward |",
             "|---|---|---|---|---|---|"]
    for row in results["summary"]:
        threshold = f"fixed at {results['threshold_bytes'] // 1024} KiB" if row["fixed"] else "glibc's own"
        growth = ", ".join(f"{value:.1f}" for value in row["growth_mib"])
        lines.append(f"| {row['weights']} | {threshold} | {growth} | {row['after_widths_mib']:.1f} "
                     f"| {row['prefill_seconds']:.2f} | {row['verify_ms_per_forward']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    answer_if_worker(worker)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--weights", default="int8,fp32,bf16,int4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="heap_threshold_memory")
    args = parser.parse_args()
    import torch

    from pocketspec.machine_report import cpu_name
    from pocketspec.torch_model.glibc_heap import MMAP_THRESHOLD_BYTES

    for name in [name for name in os.environ if name == "GLIBC_TUNABLES" or name.startswith("MALLOC_")]:
        os.environ.pop(name)  # a user's malloc settings would keep load_model's threshold off in the workers
    rows = []
    for round_index in range(args.rounds):
        for weights in args.weights.split(","):
            for fixed in ((False, True) if round_index % 2 == 0 else (True, False)):
                config = {"model": args.model, "weights": weights, "fixed": fixed, "threads": args.threads}
                rows.append(run_worker(__file__, config, what=f"{weights}, fixed threshold {fixed}"))
    results = {"model": args.model, "threads": args.threads, "rounds": args.rounds, "torch": torch.__version__,
               "cpu": cpu_name(), "threshold_bytes": MMAP_THRESHOLD_BYTES, "rows": rows, "summary": summary(rows)}
    write_results(args.name, results, markdown(results))


if __name__ == "__main__":
    main()
