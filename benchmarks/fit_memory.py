"""Fits memplanner's llama.cpp CPU constants from calibrate_memory.py's observations and
writes memplanner/constants.py (a generated file: edit this script, not the output).

Compute buffer (ggml-alloc reuses memory, so its size is the largest of a few peaks):
  output peak    = 4 * n_out * vocab + 4 * k_out * u * hidden           (logits rows of a ubatch)
  FFN/FA peak    = 4 * u * (k_ffn * ffn + k_hid * hidden) + 2 * u * n_ctx   (f16 KQ mask, flash attention)
  KQ peak, no FA = 4 * u * n_ctx * (heads + 1) + 4 * k_kq * u * hidden    (f32 scores + f32 mask)
  compute        = max(peaks) + const, const chosen so that no observation is under-predicted.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONSTANTS = ROOT / "memplanner" / "constants.py"
MIB = 1024 * 1024
DEVICE = "2-core x86_64 CPU, llama-cpp-python 0.3.36 portable build"


def _rows(observations, models_dir):
    import sys

    sys.path.insert(0, str(ROOT))
    from memplanner.shapes import shape_from_gguf

    for record in observations["models"]:
        if "contexts" not in record:
            continue
        shape = shape_from_gguf(models_dir / f"{record['model']}.gguf")
        for context in record["contexts"]:
            sizes = context.get("buffers_mib", {})
            if "compute" not in sizes or context["kv_type"] != 1:
                continue
            yield shape, context["flash_attn"] != 0, sizes


def _features(shape, sizes):
    u, n_ctx, n_out = sizes["n_ubatch"], sizes["kv_cells"], sizes["n_outputs_max"]
    return u, n_ctx, min(n_out, u), sizes["compute"] * MIB


def fit_compute(rows):
    """Least squares per peak on the rows where that peak clearly dominates."""
    out_x, out_y, fa_x, fa_y, kq_x, kq_y = [], [], [], [], [], []
    for shape, flash, sizes in rows:
        u, n_ctx, n_out, observed = _features(shape, sizes)
        if n_out == u and u >= 64:
            out_x.append([u * shape.hidden_size, 1.0]); out_y.append(observed - 4 * n_out * shape.vocab_size)
        elif flash and n_out <= 9:
            fa_x.append([u * shape.intermediate_size, u * shape.hidden_size, 1.0])
            fa_y.append(observed - 2 * u * n_ctx)
        elif not flash and n_out <= 9 and n_ctx >= 1024:
            kq_x.append([u * shape.hidden_size, 1.0]); kq_y.append(observed - 4 * u * n_ctx * (shape.num_heads + 1))
    k_out = np.linalg.lstsq(np.array(out_x), np.array(out_y), rcond=None)[0][0] / 4
    k_ffn, k_hid = np.linalg.lstsq(np.array(fa_x), np.array(fa_y), rcond=None)[0][:2] / 4
    k_kq = np.linalg.lstsq(np.array(kq_x), np.array(kq_y), rcond=None)[0][0] / 4
    return {"k_out": round(float(k_out), 3), "k_ffn": round(float(k_ffn), 3),
            "k_hid": round(float(k_hid), 3), "k_kq": round(float(k_kq), 3)}


def predict_compute(coefficients, shape, flash, u, n_ctx, n_out):
    output_peak = 4 * n_out * shape.vocab_size + 4 * coefficients["k_out"] * u * shape.hidden_size
    ffn_peak = 4 * u * (coefficients["k_ffn"] * shape.intermediate_size + coefficients["k_hid"] * shape.hidden_size)
    peaks = [output_peak, ffn_peak + 2 * u * n_ctx]
    if not flash:
        peaks.append(4 * u * n_ctx * (shape.num_heads + 1) + 4 * coefficients["k_kq"] * u * shape.hidden_size)
    return max(peaks)


def fit_and_write(observations, models_dir) -> None:
    rows = list(_rows(observations, Path(models_dir)))
    coefficients = fit_compute(rows)
    residuals = {True: [], False: []}
    for shape, flash, sizes in rows:
        u, n_ctx, n_out, observed = _features(shape, sizes)
        residuals[flash].append(observed - predict_compute(coefficients, shape, flash, u, n_ctx, n_out))
    const = {flash: int(max(values)) for flash, values in residuals.items()}
    for flash, values in residuals.items():
        over = [const[flash] - value for value in values]
        print(f"compute, flash_attn={flash}: {len(values)} contexts, const {const[flash] / MIB:.2f} MiB, "
              f"over-prediction median {statistics.median(over) / MIB:.2f} MiB, max {max(over) / MIB:.2f} MiB")
    process_base = [record["rss_baseline"]["rss"] for record in observations["models"] if "rss_baseline" in record]
    runtime = [record["rss_runtime"]["rss"] - record["rss_baseline"]["rss"]
               for record in observations["models"] if "rss_baseline" in record]
    metadata_x, metadata_y = [], []
    for record in observations["models"]:
        if "rss_loaded" not in record:
            continue
        from memplanner.shapes import shape_from_gguf
        from memplanner.terms import resident_weights_bytes

        shape = shape_from_gguf(Path(models_dir) / f"{record['model']}.gguf")
        model_mib = sum(v for k, v in record["model_buffers"].items() if k.startswith("model:"))
        # the weights as loaded: the mapped file, or read without mmap the tensors not repacked
        weights = resident_weights_bytes(shape, "cpu", repack_weights=True)
        extra = record["rss_loaded"]["rss"] - record["rss_runtime"]["rss"] - weights
        repack = record["model_buffers"].get("model:CPU_REPACK", 0.0) * MIB
        metadata_x.append([shape.vocab_size, 1.0]); metadata_y.append(extra - repack)
        print(f"{record['model']}: model buffers {model_mib:.2f} MiB, repacked {repack / MIB:.2f} MiB, "
              f"RSS over weights+repack {(extra - repack) / MIB:.2f} MiB")
    per_vocab, base = np.linalg.lstsq(np.array(metadata_x), np.array(metadata_y), rcond=None)[0]
    CONSTANTS.write_text(TEMPLATE.format(
        date=observations["date"], device=DEVICE,
        process_base=int(max(process_base)), runtime=int(max(runtime)), per_vocab=int(round(per_vocab)), base=int(max(base, 0)),
        const_fa=const[True], const_nofa=const[False], **coefficients,
    ))
    print(f"wrote {CONSTANTS}")


TEMPLATE = '''"""Measured constants of the llama.cpp CPU memory model (generated by benchmarks/fit_memory.py).

Measured on {date}, {device}; raw observations are in
benchmarks/results/memory_calibration.json. Re-run benchmarks/calibrate_memory.py on a new
device or llama.cpp version; do not edit the numbers by hand.
"""

MEASURED_DATE = "{date}"
MEASURED_ON = "{device}"

# llama.cpp rounds n_ctx up to a multiple of 256 (observed: 300 -> 512, 4105 -> 4352 cells).
LLAMA_CPP_N_CTX_PAD = 256

# RSS of the Python interpreter with the CLI's modules imported, before any backend library
# or model (max over 3 runs): the first part of the whole-process peak a CPU budget bounds.
PROCESS_BASE_BYTES = {process_base}
# RSS that importing llama_cpp and llama_backend_init add to that base (max over 3 runs).
RUNTIME_OVERHEAD_BYTES = {{"cpu": {runtime}}}
# Not measured: a CUDA context and cuBLAS workspace are commonly 300-500 MiB of device memory.
ESTIMATED_CUDA_OVERHEAD_BYTES = 512 * 1024 * 1024

# RSS a loaded model adds beyond its weights (the mapped file, or the tensors read without mmap)
# and repacked weights: vocabulary tables and tensor metadata, fitted as per_vocab * vocab_size
# + base over the three models.
MODEL_METADATA_BYTES_PER_VOCAB = {per_vocab}
MODEL_METADATA_BASE_BYTES = {base}

# The CPU backend copies these weight types into an interleaved CPU_REPACK buffer at load
# (anonymous memory; the GGUF is then read without mmap); token_embd is never repacked (observed:
# 596.53 MiB of Q4_K for qwen2.5-coder-1.5b, 28.05 MiB for the 0.5b, none for Q4_1/Q8_0).
REPACKED_TYPES = ("Q4_0", "Q4_K", "IQ4_NL")

# Compute buffer: max of the peaks below + const (see benchmarks/fit_memory.py), in floats
# per ubatch token; llama.cpp reserves it for n_ubatch tokens and n_outputs_max logits rows.
COMPUTE_OUTPUT_HIDDEN = {k_out}  # x n_ubatch x hidden, next to the n_outputs x vocab logits
COMPUTE_FFN = {k_ffn}  # x n_ubatch x feed-forward width (flash attention on)
COMPUTE_FFN_HIDDEN = {k_hid}  # x n_ubatch x hidden (flash attention on)
COMPUTE_KQ_HIDDEN = {k_kq}  # x n_ubatch x hidden beside the f32 KQ scores (flash attention off)
COMPUTE_CONST_BYTES = {{True: {const_fa}, False: {const_nofa}}}  # by flash attention on/off
'''
