"""The ONNX Runtime backend's predicted peak (memplanner/onnx_sizes.py) against measured peak RSS.

    .venv/bin/python benchmarks/onnx_memory_grid.py [--models smollm2-135m-instruct qwen2.5-coder-0.5b-instruct]

Each configuration (model x weights x context x prompt chunk x prepacking) runs in a fresh process: it
opens the backend, prefills a prompt that fills the context but for a verify's room, runs the widest
verify, and reads the process's peak RSS (VmHWM). Exports are made first, in processes of their own.
Writes benchmarks/results/onnx_memory_grid.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_process import ROOT, answer_if_worker, run_worker  # noqa: E402

# (weights, context, n_batch, prepack)
CONFIGS = [("fp32", 512, 512, False), ("fp32", 4096, 512, False), ("fp32", 4096, 64, False),
           ("int4", 2048, 256, False), ("fp16", 1024, 512, False), ("fp32", 2048, 512, True),
           ("int4", 4096, 512, True)]
COLUMNS = ["model", "weights", "context", "n_batch", "prepacked", "predicted MiB", "measured MiB",
           "measured ÷ predicted"]
MAX_LOGITS_ROWS = 33


def worker(config: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    from dataclasses import replace

    from pocketspec.backends.torch_open import open_backend
    from pocketspec.models.catalog import model_path
    from pocketspec.settings import ModelSettings
    from pocketspec.stats import peak_rss_bytes

    settings = replace(ModelSettings(), backend="onnx", weights=config["weights"], max_context=config["context"],
                       n_batch=config["n_batch"], max_logits_rows=MAX_LOGITS_ROWS, prepack_weights=config["prepack"])
    with open_backend(model_path(config["model"]), settings) as backend:
        if config.get("prepare_only"):
            return {}
        opened = peak_rss_bytes()
        num_prompt = config["context"] - MAX_LOGITS_ROWS
        backend.prefill([(7 * index) % (backend.vocab_size - 200) + 100 for index in range(num_prompt)])
        prefilled = peak_rss_bytes()
        backend.forward([100] * MAX_LOGITS_ROWS, range(MAX_LOGITS_ROWS))
        # the process's peak so far after each phase: what opening, the prefill and the verify each raised it to
        return {"peak_bytes": peak_rss_bytes(), "opened_peak_bytes": opened, "prefilled_peak_bytes": prefilled}


def predicted(config: dict) -> dict[str, int]:
    sys.path.insert(0, str(ROOT))
    from memplanner.onnx_sizes import onnx_peak_terms
    from memplanner.shapes import shape_from_gguf
    from memplanner.torch_sizes import gguf_layout
    from pocketspec.models.catalog import model_path

    path = model_path(config["model"])
    is_tied, has_qkv_bias = gguf_layout(path)
    return onnx_peak_terms(shape_from_gguf(path), weights_format=config["weights"], max_context=config["context"],
                           n_batch=config["n_batch"], max_logits_rows=MAX_LOGITS_ROWS, is_tied=is_tied,
                           has_qkv_bias=has_qkv_bias, prepacks=config["prepack"])


def main() -> None:
    answer_if_worker(worker)
    sys.path.insert(0, str(ROOT))
    from apps.report import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
    parser.add_argument("--name", default="onnx_memory_grid")
    args = parser.parse_args()
    points, rows = [], []
    for model in args.models:
        for weights in sorted({config[0] for config in CONFIGS}):
            run_worker(__file__, {"model": model, "weights": weights, "context": 64, "n_batch": 64,
                                  "prepack": False, "prepare_only": True}, what=f"{model} {weights} export")
        for weights, context, n_batch, prepack in CONFIGS:
            config = {"model": model, "weights": weights, "context": context, "n_batch": n_batch, "prepack": prepack}
            print(f"{model} {weights} context {context} n_batch {n_batch} prepack {prepack}", file=sys.stderr)
            terms = predicted(config)
            peaks = run_worker(__file__, config, what=f"{model} {weights} {context}")
            measured, total = peaks["peak_bytes"], sum(terms.values())
            points.append({**config, "predicted_terms": terms, "predicted_bytes": total, "measured_bytes": measured,
                           "opened_peak_bytes": peaks["opened_peak_bytes"],
                           "prefilled_peak_bytes": peaks["prefilled_peak_bytes"]})
            rows.append([model, weights, context, n_batch, "yes" if prepack else "no", f"{total / 2**20:.0f}",
                         f"{measured / 2**20:.0f}", f"{measured / total:.3f}"])
    write_results(ROOT / "benchmarks" / "results", args.name, {"config": vars(args), "points": points},
                  "ONNX Runtime backend: predicted peak against measured peak RSS", COLUMNS, rows,
                  notes=["prefill of context - 33 tokens in n_batch chunks, then a verify of 33 rows",
                         "predicted: memplanner/onnx_sizes.onnx_peak_terms, whose weights terms are bounds"])
    print(f"wrote {ROOT / 'benchmarks' / 'results' / args.name}.{{json,md}}")


if __name__ == "__main__":
    main()
