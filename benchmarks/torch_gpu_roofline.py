"""Plain decoding on a GPU against the memory-bandwidth roofline, for random-weight models of real shapes.

    .venv/bin/python benchmarks/torch_gpu_roofline.py [--device cuda] [--weights bf16 int8] [--context 1024]

One-token decoding reads every weight and the whole KV cache once per token, so its
ceiling is (measured HBM bandwidth) / (bytes read per token). The bandwidth is measured
here with a large device-to-device copy; the bytes come from the planner's exact torch
counts (memplanner/torch_sizes.py), so the efficiency column is measured tok/s over that
ceiling. Weights are random (shapes are what matter for bandwidth), built on the meta
device and materialised on the target device. `--device cpu` runs the same measurement
on the CPU, as a smoke test of the script. Results: benchmarks/results/torch_gpu_roofline.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memplanner.shapes import ModelShape  # noqa: E402
from memplanner.torch_sizes import torch_kv_bytes, torch_weight_bytes  # noqa: E402
from pocketspec.backends.torch_backend import TorchBackend  # noqa: E402
from pocketspec.settings import AUTO, DECODE_STEPS, ModelSettings  # noqa: E402
from pocketspec.torch_model.device import resolve_device  # noqa: E402
from pocketspec.torch_model.model import ModelConfig, Transformer, rope_inv_freq  # noqa: E402
from pocketspec.torch_model.quantize import Int4Linear, Int8Linear, swap_linears  # noqa: E402
from pocketspec.torch_model.load import compute_dtype  # noqa: E402

# Real shapes (config.json of each model): layers, dim, heads, kv heads, ffn, vocab, arch, tied.
SHAPES = {
    "smollm2-135m": ModelConfig("llama", 30, 576, 9, 3, 64, 1536, 49152, 100000.0, 1e-5, False, True),
    "qwen2.5-0.5b": ModelConfig("qwen2", 24, 896, 14, 2, 64, 4864, 151936, 1e6, 1e-6, True, True),
    "qwen2.5-1.5b": ModelConfig("qwen2", 28, 1536, 12, 2, 128, 8960, 151936, 1e6, 1e-6, True, True),
    "llama-3.1-8b": ModelConfig("llama", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0, 1e-5, False, False),
}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device, num_bytes: int = 2 ** 30, repeats: int = 10) -> float:
    """Bytes per second of a device-to-device copy (each copy reads and writes num_bytes)."""
    source = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    _synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    _synchronize(device)
    return 2 * num_bytes * repeats / (time.perf_counter() - started)


def random_model(config: ModelConfig, weights: str, device: torch.device) -> Transformer:
    """Random weights in `weights` format, materialised straight on `device` in their own dtype (cast
    on the meta device first: materialising fp32 and then casting would double the peak)."""
    dtype = compute_dtype(weights, device)
    with torch.device("meta"):
        model = Transformer(config)
        swap_linears(model, weights, dtype)
        model = model.to(dtype=dtype)  # integer weights keep their dtype
    model = model.to_empty(device=device)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02)
        for module in model.modules():
            if isinstance(module, (Int8Linear, Int4Linear)):
                module.load(torch.randn(module.out_features, module.in_features, device=device) * 0.02)
    model.inv_freq = rope_inv_freq(config, device)
    return model.eval()


def shape_of(name: str, config: ModelConfig) -> ModelShape:
    return ModelShape(name=name, arch=config.arch, num_layers=config.num_layers, hidden_size=config.dim,
                      num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                      vocab_size=config.vocab_size, weight_bytes=0, file_bytes=0, context_length_trained=0,
                      intermediate_size=config.ffn_dim)


def decode_rate(backend: TorchBackend, context: int, num_tokens: int) -> float:
    """One-token forwards per second after `context` cached tokens."""
    backend.rollback(0)
    backend.prefill([7] * context)
    for _ in range(3):
        backend.forward([7], [0])
    backend.rollback(context)
    _synchronize(backend.device)
    started = time.perf_counter()
    for _ in range(num_tokens):
        backend.forward([7], [0])
    _synchronize(backend.device)
    return num_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--weights", nargs="+", default=["bf16", "int8"])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--num-tokens", type=int, default=64)
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the forward first (the static step: CUDA graphs, warmed up per bucket)")
    parser.add_argument("--decode-step", choices=DECODE_STEPS, default=AUTO, help="auto: static on a GPU")
    args = parser.parse_args()
    device = resolve_device(args.device)
    bandwidth = measure_bandwidth(device, 2 ** 30 if device.type == "cuda" else 2 ** 28)
    name_of_device = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = []
    for name in args.models:
        config = SHAPES[name]
        for weights in args.weights:
            model = random_model(config, weights, device)
            settings = ModelSettings(backend="torch", device=args.device, weights=weights, compile=args.compile,
                                     max_context=args.context + args.num_tokens + 8, max_logits_rows=1,
                                     decode_step=args.decode_step)
            if args.compile and not settings.uses_static_step:  # the static step compiles itself
                model.forward = torch.compile(model.forward, dynamic=True)
            backend = TorchBackend(model, settings, tokenizer=None, model_path=None)
            kv_dtype = backend.kv_dtype
            shape = shape_of(name, config)
            weight_bytes = torch_weight_bytes(shape, weights, is_tied=config.is_tied,
                                              has_qkv_bias=config.has_qkv_bias, on_gpu=device.type == "cuda")
            kv_read_bytes = torch_kv_bytes(shape, kv_dtype, args.context)
            tokens_per_second = decode_rate(backend, args.context, args.num_tokens)
            ceiling = bandwidth / (weight_bytes + kv_read_bytes)
            rows.append({"model": name, "weights": weights, "kv_dtype": kv_dtype, "context": args.context,
                         "weight_bytes": weight_bytes, "kv_read_bytes": kv_read_bytes,
                         "tokens_per_second": round(tokens_per_second, 2), "roofline_tokens_per_second": round(ceiling, 2),
                         "efficiency": round(tokens_per_second / ceiling, 4)})
            print(rows[-1], flush=True)
            backend.close()
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    results = {"device": name_of_device, "torch": torch.__version__, "bandwidth_bytes_per_second": bandwidth,
               "compile": args.compile, "decode_step": args.decode_step, "rows": rows}
    suffix = "" if device.type == "cuda" else "_cpu_smoke"
    out = ROOT / "benchmarks" / "results"
    (out / f"torch_gpu_roofline{suffix}.json").write_text(json.dumps(results, indent=1))
    lines = [f"# Decode vs roofline on {name_of_device}", "",
             f"torch {torch.__version__}; measured copy bandwidth {bandwidth / 1e9:.1f} GB/s; context {args.context}; "
             f"compile {args.compile}; decode step {args.decode_step}.", "",
             "| model | weights | KV | weights MB | KV read MB | tok/s | roofline tok/s | efficiency |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['weights']} | {row['kv_dtype']} | {row['weight_bytes'] / 1e6:.0f} | "
                     f"{row['kv_read_bytes'] / 1e6:.1f} | {row['tokens_per_second']:.1f} | "
                     f"{row['roofline_tokens_per_second']:.1f} | {row['efficiency']:.0%} |")
    (out / f"torch_gpu_roofline{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
