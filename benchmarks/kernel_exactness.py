"""Which of llama.cpp's CPU operators compute a verify batch's rows differently from one-row decoding.

    .venv/bin/python benchmarks/kernel_exactness.py [--max-width 32]

For each operator of a verify (the weight matmul per quant type and layout, the output head's type,
flash attention per KV type at depths 0 and 1024), it runs batches of 1..max-width rows through the
installed llama-cpp-python's own ggml (pocketspec/backends/ggml_ops.py) and compares each row, bit
for bit, with the same row computed alone. Twice, each in a fresh process: with the row-exact
kernels of native/patches/row-exact-verify.patch, and with GGML_CPU_ROW_EXACT=0, which runs the
stock kernels of the same build. Writes benchmarks/results/kernel_exactness.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_process import ROOT, answer_if_worker, run_worker  # noqa: E402

# (weight type, repacked, which kernel runs a batch in the stock build on x86)
MATMULS = [
    ("q4_k", False, "vec_dot one row per call; the tiled K-quant kernel from 8 rows"),
    ("q4_k", True, "repacked gemv; the 4-row gemm from 4 rows"),
    ("q6_k", False, "vec_dot; the tiled kernel from 8 rows (Q4_K_M's output head and half its ffn_down)"),
    ("q5_k", False, "vec_dot; the tiled kernel from 8 rows"),
    ("q8_0", False, "vec_dot for one row; llamafile sgemm (tinyBLAS) from 2 rows"),
    ("q4_0", False, "vec_dot for one row; llamafile sgemm from 2 rows"),
    ("q4_0", True, "repacked gemv; the gemm from 4 rows"),
    ("iq4_nl", False, "vec_dot for one row; llamafile sgemm from 2 rows"),
    ("iq4_nl", True, "repacked gemv; the gemm from 4 rows"),
    ("q4_1", False, "vec_dot at every width"),
    ("q2_k", False, "vec_dot; the tiled kernel from 8 rows"),
    ("q2_k", True, "repacked gemv; the gemm from 4 rows"),
    ("q5_0", False, "vec_dot for one row; llamafile sgemm from 2 rows"),
    ("f16", False, "vec_dot for one row; llamafile sgemm from 2 rows"),
    ("bf16", False, "vec_dot for one row; llamafile sgemm from 2 rows"),
    ("f32", False, "vec_dot for one row; llamafile sgemm from 2 rows"),
]
ATTENTION = [("f16", 0), ("f16", 1024), ("bf16", 0), ("bf16", 1024), ("q8_0", 0), ("q8_0", 1024)]
COLUMNS = ["operator", "weights or cache", "stock build: exact widths", "row-exact build: exact widths",
           "stock kernel for a batch"]


def worker(config: dict) -> dict:
    import logging
    import os

    if not config["row_exact"]:
        os.environ["GGML_CPU_ROW_EXACT"] = "0"  # read at the first matmul, after this
    sys.path.insert(0, str(ROOT))
    from pocketspec.backends import ggml_ops

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # repacking logs every tensor
    width = config["max_width"]
    matmuls = {f"{kind}{' repacked' if repack else ''}": ggml_ops.matmul_exact_widths(kind, repack, width)
               for kind, repack, _ in MATMULS}
    attention = {f"{kind} at depth {depth}": ggml_ops.attention_exact_widths(kind, depth, width)
                 for kind, depth in ATTENTION}
    return {"row_exact_max_rows": ggml_ops.row_exact_max_rows(), "matmul": matmuls, "attention": attention}


def main() -> None:
    answer_if_worker(worker)
    sys.path.insert(0, str(ROOT))
    from apps.report import write_results
    from pocketspec.backends.ggml_ops import describe_widths
    from pocketspec.machine_report import collect_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-width", type=int, default=32)
    parser.add_argument("--name", default="kernel_exactness")
    args = parser.parse_args()
    runs = {}
    for row_exact in (False, True):
        print(f"{'row-exact' if row_exact else 'stock'} kernels", file=sys.stderr)
        runs["row_exact" if row_exact else "stock"] = run_worker(
            __file__, {"row_exact": row_exact, "max_width": args.max_width}, what="exactness worker")
    stock, patched = runs["stock"], runs["row_exact"]
    rows = []
    for kind, repack, kernel in MATMULS:
        key = f"{kind}{' repacked' if repack else ''}"
        rows.append(["matmul", key, describe_widths(stock["matmul"][key]), describe_widths(patched["matmul"][key]),
                     kernel])
    for kind, depth in ATTENTION:
        key = f"{kind} at depth {depth}"
        kernel = ("one row: the cache split over the threads from 512 cells; a batch: one pass per row"
                  if kind == "f16" and depth else "one pass per row at every width")
        rows.append(["flash attention", key, describe_widths(stock["attention"][key]),
                     describe_widths(patched["attention"][key]), kernel])
    llama = collect_report()["llama_cpp"]
    notes = [f"widths 1-{args.max_width}; a width is exact when every row of the batch equals its one-row result "
             "bit for bit",
             f"build: llama-cpp-python {llama['version']}, patch {(llama['build'] or {}).get('patch', 'unknown')}, "
             f"row-exact rows {patched['row_exact_max_rows']} (0 with GGML_CPU_ROW_EXACT=0: "
             f"{stock['row_exact_max_rows']})",
             f"llama.cpp system info: {llama['system_info']}",
             "matmul: random weights [256, 1536], random activations; attention: 12 heads, 2 KV heads, "
             "head size 128, causal mask, the cache padded to 256 cells as llama.cpp pads it"]
    write_results(ROOT / "benchmarks" / "results", args.name, {"config": vars(args), "runs": runs},
                  "Verify rows against one-row decoding, per CPU operator", COLUMNS, rows, notes=notes)
    print(f"wrote {ROOT / 'benchmarks' / 'results' / args.name}.{{json,md}}")


if __name__ == "__main__":
    main()
