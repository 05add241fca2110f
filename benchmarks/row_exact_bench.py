"""What the row-exact kernels cost: verify widths, plain decoding and prefill, with and without them.

    .venv/bin/python benchmarks/row_exact_bench.py [--model qwen2.5-coder-1.5b-instruct] [--threads 2] \
        [--depths 0 512 2048] [--widths 1 2 3 4 6 8 12 16 24 32] [--rounds 3] [--kv-type f16] [--no-repack]

The same installed build runs both ways, each in fresh processes: its row-exact kernels
(native/patches/row-exact-verify.patch) and, with GGML_CPU_ROW_EXACT=0, llama.cpp's stock kernels.
Each worker opens the model as PocketSpec does (llama.cpp, repacked weights unless --no-repack),
times a verify pass of every width after each depth of cached tokens (every row's logits, as a
verify asks), one-token decoding (64 tokens after 64) and a 512-token prefill. The modes alternate
over --rounds and each point keeps its median. Run it on a quiet machine. Writes
benchmarks/results/row_exact_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_process import ROOT, answer_if_worker, run_worker  # noqa: E402

MODES = ("stock", "row-exact")
DECODE_TOKENS = 64
PREFILL_TOKENS = 512


def _token(index: int, vocab_size: int) -> int:
    return (7 * index) % (vocab_size - 200) + 100


def worker(config: dict) -> dict:
    import os
    import time

    if config["mode"] == "stock":
        os.environ["GGML_CPU_ROW_EXACT"] = "0"  # read at the first matmul, after this
    sys.path.insert(0, str(ROOT))
    from pocketspec.backends.ggml_ops import row_exact_max_rows
    from pocketspec.backends.llama_cpp_backend import LlamaCppBackend
    from pocketspec.models.catalog import model_path
    from pocketspec.settings import ModelSettings

    widths = config["widths"]
    settings = ModelSettings(max_context=max(config["depths"]) + max(widths) + 64, num_threads=config["threads"],
                             kv_type=config["kv_type"], repack_weights=config["repack"], max_logits_rows=max(widths))
    verify_ms: dict[str, dict[str, float]] = {}
    with LlamaCppBackend(model_path(config["model"]), settings) as backend:
        vocab = backend.vocab_size
        tokens = [_token(index, vocab) for index in range(max(config["depths"]) + max(widths))]
        for depth in config["depths"]:
            backend.rollback(0)
            if depth:
                backend.prefill(tokens[:depth])
            samples = {width: [] for width in widths}
            for _ in range(config["repeats"]):
                for width in widths:  # interleaved: a busy spell touches every width
                    backend.rollback(depth)
                    start = time.perf_counter()
                    backend.forward(tokens[depth:depth + width], range(width))
                    samples[width].append(time.perf_counter() - start)
            verify_ms[str(depth)] = {str(width): 1000 * statistics.median(times) for width, times in samples.items()}
        backend.rollback(0)
        backend.prefill(tokens[:64])
        start = time.perf_counter()
        token = tokens[64]
        for _ in range(DECODE_TOKENS):
            token = int(backend.forward([token], [0])[0].argmax())
        decode_tps = DECODE_TOKENS / (time.perf_counter() - start)
        backend.rollback(0)
        prompt = [_token(index, vocab) for index in range(PREFILL_TOKENS)]
        start = time.perf_counter()
        backend.prefill(prompt)
        prefill_tps = PREFILL_TOKENS / (time.perf_counter() - start)
    return {"row_exact_max_rows": row_exact_max_rows(), "verify_ms": verify_ms, "decode_tps": decode_tps,
            "prefill_tps": prefill_tps}


def main() -> None:
    answer_if_worker(worker)
    sys.path.insert(0, str(ROOT))
    from apps.report import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 512, 2048])
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="passes of each width per depth in one worker")
    parser.add_argument("--kv-type", default="f16")
    parser.add_argument("--no-repack", dest="repack", action="store_false")
    parser.add_argument("--name", default="row_exact_bench")
    args = parser.parse_args()
    runs = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
        for mode in MODES:
            print(f"round {round_index + 1}/{args.rounds}: {mode}", file=sys.stderr)
            config = {"mode": mode, "model": args.model, "threads": args.threads, "depths": args.depths,
                      "widths": args.widths, "repeats": args.repeats, "kv_type": args.kv_type, "repack": args.repack}
            runs[mode].append(run_worker(__file__, config, what=f"{mode} worker"))
    if runs["row-exact"][0]["row_exact_max_rows"] == 0:
        raise SystemExit("this build has no row-exact kernels (native/build_llama_cpp.sh builds them): "
                         "both modes would run the stock kernels")

    def median(mode: str, read) -> float:
        return statistics.median(read(run) for run in runs[mode])

    columns = ["depth", "rows", "stock ms", "row-exact ms", "stock × one row", "row-exact × one row",
               "row-exact ÷ stock"]
    rows, curves = [], {}
    for depth in map(str, args.depths):
        one = {mode: median(mode, lambda run: run["verify_ms"][depth]["1"]) for mode in MODES}
        for width in map(str, args.widths):
            ms = {mode: median(mode, lambda run: run["verify_ms"][depth][width]) for mode in MODES}
            curves.setdefault(depth, {})[width] = ms
            rows.append([depth, width, f"{ms['stock']:.1f}", f"{ms['row-exact']:.1f}",
                         f"{ms['stock'] / one['stock']:.2f}", f"{ms['row-exact'] / one['row-exact']:.2f}",
                         f"{ms['row-exact'] / ms['stock']:.2f}"])
    decode = {mode: median(mode, lambda run: run["decode_tps"]) for mode in MODES}
    prefill = {mode: median(mode, lambda run: run["prefill_tps"]) for mode in MODES}
    notes = [f"model {args.model}, {args.threads} threads, KV {args.kv_type}, "
             f"{'repacked' if args.repack else 'unrepacked'} weights; medians of {args.rounds} rounds × "
             f"{args.repeats} passes; the modes alternate, each in a fresh process",
             f"plain decoding ({DECODE_TOKENS} tokens after 64): stock {decode['stock']:.2f} tok/s, row-exact "
             f"{decode['row-exact']:.2f} tok/s ({decode['row-exact'] / decode['stock']:.3f}×)",
             f"prefill ({PREFILL_TOKENS} tokens): stock {prefill['stock']:.1f} tok/s, row-exact "
             f"{prefill['row-exact']:.1f} tok/s ({prefill['row-exact'] / prefill['stock']:.3f}×)",
             "stock: the same build with GGML_CPU_ROW_EXACT=0, which runs llama.cpp's own kernels"]
    write_results(ROOT / "benchmarks" / "results", args.name,
                  {"config": vars(args), "runs": runs, "verify_ms": curves, "decode_tps": decode, "prefill_tps": prefill},
                  "Verify, decode and prefill cost with and without the row-exact kernels", columns, rows, notes=notes)
    print(f"wrote {ROOT / 'benchmarks' / 'results' / args.name}.{{json,md}}")


if __name__ == "__main__":
    main()
