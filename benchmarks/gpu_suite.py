"""The GPU suite: the torch backend's decode and verify on a GPU, against the bandwidth roofline, in minutes.

    PYTHONPATH=. python3 benchmarks/gpu_suite.py [--out-dir DIR] [--budget-s 420]
    PYTHONPATH=. python3 benchmarks/gpu_suite.py --device cpu --quick      # the same code on a CPU

It needs no model files and no network: every model is random weights of a real shape
(benchmarks/torch_gpu_roofline.py builds them), so it runs from a plain copy of the
repository on any machine with torch, numpy and jinja2 (which a GPU image has; nothing of
llama.cpp, gguf or the server is imported). Each model and weight format runs in its own
process (benchmarks/gpu_suite_group.py) under its own timeout, so one slow compile costs its own rows only; the results
files are rewritten after every row, so a run cut short still leaves what it measured.

What it measures (batch 1, --context cached tokens):
- whether the device's seeded draws are the host's: the hashed uniforms bit for bit (int64 arithmetic
  wrapping as uint64's) and the token 32 rows draw at temperature 1 and with top-p;
- decode tok/s for each model x weights x decode step, beside the roofline (measured copy
  bandwidth over the bytes a token reads: weights + the KV cache) and the seconds the backend
  took to open (compiling and capturing included). Decode steps:
  eager = the dynamic forward; graphs = the static step replayed as CUDA graphs;
  compiled = the same with its blocks and attention compiled (the default on a GPU);
  compiled-sdpa = that with attention through SDPA instead of matmuls; compiled-step = the
  whole step compiled, then captured; reduce-overhead = the whole step under Inductor's own
  CUDA graphs (what --compile was before); compiled-unfused = compiled with q/k/v and gate/up
  as separate matmuls (fused_projections.py fuses them on a GPU); compiled-dequant (int8) =
  compiled with the int8 linears' "dequantize" kernel (Inductor lowers the dequantizing matmul
  itself) instead of quant_kernels' int8_reduction and int8_dequantized_mm; compiled-materialized
  (int8) = compiled with int8_reduction's rows computed once before it (MATERIALIZE_REDUCTION_ROWS);
  compiled-torchao (int8) = compiled with torchao's int8 weight-only tensors (library_linears.py);
  compiled-gemlite = compiled with GemLite's Triton kernels for every linear (library_linears.py;
  its pure-Python wheel is carried beside the suite, as the device README says of wheels);
  compiled-gemlite-fp8 (bf16) = every linear quantized to fp8 and run by GemLite (changed weights: a
  speed row only, for an fp8 weights format);
  compiled-flex = compiled with attention through FlexAttention over the cache's filled blocks
  (step_attention.flex_grouped_attention); compiled-write = compiled with the cache written inside
  the compiled projection (static_step.project_into_cache); compiled-flex-write = both;
  compiled-step-flex = the whole step compiled with FlexAttention;
- the first compile against a cached one (a second process on the same compile cache);
- the speculative loop's host side: greedy n-gram speculation by the real engine on the verify
  curve's cost table, its step time and the share of it outside the forwards, beside plain decoding;
- the compiled verify curve: ms per verify of width 1-32 at depth 0 and --context, and what
  of it is host time (the verify call's wall time minus its graph's replay);
- a sampled verify (temperature 0.8, top-p 0.95) against a greedy one at widths 1, 16 and 32: its ms and
  the allocator's peak during the call, beside the torch plan's term for the sampling temporaries;
- the default (compiled) step's verify curve as a cost table
  (DIR/gpu_suite_costs_<model>_<weights>.json, POCKETSPEC_HOME/costs format), and the
  speculative speedup benchmarks/replay_drafting.py predicts on it for the recorded
  traces (benchmarks/results/traces), where those and the time are there.
Results: DIR/gpu_suite.json and DIR/gpu_suite.md (default benchmarks/results; --device cpu
writes gpu_suite_cpu.*).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_suite_group import cost_table, run_group  # noqa: E402  (the measuring, in each group's process)
from gpu_suite_report import markdown  # noqa: E402

TRACES = ("code_edit_qwen.jsonl", "spec_bench_a_qwen.jsonl")


def full_plan() -> list[dict]:
    """(model, weights, variants) groups in the order they matter; each runs in its own process."""
    return [
        {"model": "tiny", "weights": "fp32", "variants": ["eager", "graphs", "compiled", "compiled-flex-write"],
         "equality": True},
        {"model": "tiny", "weights": "int8", "variants": ["graphs", "compiled", "compiled-torchao", "compiled-gemlite"],
         "equality": True},
        {"model": "tiny", "weights": "int4", "variants": ["compiled-unfused", "compiled", "compiled-gemlite"],
         "equality": True},
        {"model": "qwen2.5-1.5b", "weights": "bf16",
         "variants": ["compiled", "compiled-flex", "compiled-write", "compiled-flex-write", "compiled-step-flex",
                      "compiled-gemlite"]},
        {"model": "llama-3.1-8b", "weights": "bf16",
         "variants": ["compiled", "compiled-flex-write", "compiled-gemlite", "compiled-gemlite-fp8"]},
        {"model": "llama-3.1-8b", "weights": "int4", "variants": ["compiled", "compiled-unfused", "compiled-gemlite"]},
        {"model": "llama-3.1-8b", "weights": "int8",
         "variants": ["compiled", "compiled-materialized", "compiled-dequant", "compiled-torchao", "compiled-gemlite"]},
        {"model": "qwen2.5-1.5b", "weights": "bf16",
         "variants": ["compiled", "compiled-unfused", "compiled-sdpa", "graphs", "eager"], "verify": True},
        {"model": "qwen2.5-1.5b", "weights": "int8",
         "variants": ["compiled", "compiled-materialized", "compiled-dequant", "compiled-torchao", "compiled-gemlite"],
         "verify": True},
        {"model": "qwen2.5-1.5b", "weights": "bf16", "variants": ["compiled-step", "reduce-overhead"]},
        {"model": "llama-3.1-8b", "weights": "bf16", "variants": ["compiled", "graphs"]},
        {"model": "qwen2.5-1.5b", "weights": "bf16", "variants": ["compiled"], "cached": True},
        {"model": "smollm2-135m", "weights": "bf16", "variants": ["compiled", "graphs"]},
        {"model": "qwen2.5-1.5b", "weights": "int4", "variants": ["compiled", "compiled-unfused", "compiled-gemlite"]},
    ]


def quick_plan() -> list[dict]:
    return [
        {"model": "tiny", "weights": "fp32", "variants": ["eager", "graphs", "compiled"], "equality": True},
        {"model": "tiny", "weights": "fp32", "variants": ["compiled", "graphs"], "verify": True},
        {"model": "tiny", "weights": "fp32", "variants": ["compiled"], "cached": True},
        {"model": "tiny", "weights": "int8", "variants": ["compiled-dequant", "graphs"]},
    ]


def measure_bandwidth(device_name: str) -> tuple[float, str, str]:
    import torch

    import torch_gpu_roofline as roofline
    from pocketspec.torch_model.device import resolve_device

    device = resolve_device(device_name)
    bandwidth = roofline.measure_bandwidth(device, 2 ** 30 if device.type == "cuda" else 2 ** 27)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return bandwidth, name, torch.__version__


def draws_check(device_name: str, vocab_size: int = 151_936, rows: int = 32) -> dict:
    """The device's seeded draws against the host's (pocketspec/speculation/draws.py): the hashed uniforms bit
    for bit (int64 arithmetic that must wrap as uint64's does) and the token each row's race draws, from the
    same float32 logits (temperature 1, and top-p 0.9)."""
    import numpy as np
    import torch

    from pocketspec.settings import SamplingSettings
    from pocketspec.speculation.draws import SeededDraws, uniforms
    from pocketspec.speculation.sampling import distribution
    from pocketspec.torch_model import device_sampling
    from pocketspec.torch_model.device import resolve_device

    device = resolve_device(device_name)
    draws = SeededDraws(2**63 - 25, 1_000_003)  # a large seed and position: every bit of the hash in use
    keys = draws.keys(rows)
    ids = np.arange(vocab_size)
    on_device = device_sampling.uniforms(torch.from_numpy(keys).to(device), torch.from_numpy(ids).to(device)).cpu()
    equal_uniform_rows = sum(np.array_equal(on_device[row].numpy(), uniforms(int(key), ids))
                             for row, key in enumerate(keys.view(np.uint64)))
    logits = np.random.default_rng(0).standard_normal((rows, vocab_size)).astype(np.float32) * 3
    found = {"uniform_rows_equal": int(equal_uniform_rows), "rows": rows}
    for name, sampling in (("t1", SamplingSettings(temperature=1.0)),
                           ("top_p", SamplingSettings(temperature=1.0, top_p=0.9))):
        probs = device_sampling.distributions(torch.from_numpy(logits).to(device), sampling)
        drawn = device_sampling.race_rows(probs, torch.from_numpy(keys).to(device)).cpu().tolist()
        host = [draws.token(distribution(logits[row], sampling), ahead=row) for row in range(rows)]
        found[f"draws_equal_{name}"] = sum(got == want for got, want in zip(drawn, host))
    return found


def run_child(group: dict, args, timeout: float, cache_dir: Path) -> list[dict]:
    command = [sys.executable, __file__, "--child", json.dumps(group), "--device", args.device,
               "--context", str(args.context), "--num-tokens", str(args.num_tokens)]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        output, failure = done.stdout, None if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-400:]}"
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        failure = f"timed out after {timeout:.0f} s"
    rows = [json.loads(line[len("RESULT "):]) for line in output.splitlines() if line.startswith("RESULT ")]
    seen = {row["variant"] for row in rows}
    rows += [{"model": group["model"], "weights": group["weights"], "variant": variant,
              "cached": bool(group.get("cached")), "error": failure or "no result"}
             for variant in group["variants"] if variant not in seen]
    print(f"  {group['model']} {group['weights']} {group['variants']}: {time.perf_counter() - started:.0f} s"
          + (f" ({failure})" if failure else ""), flush=True)
    return rows


def predicted_speedups(costs_path: Path, table: str, deadline: float) -> list[dict]:
    """replay_drafting's speedup on each recorded trace against the measured GPU table (named `table`)."""
    found = []
    for trace in TRACES:
        trace_path = ROOT / "benchmarks" / "results" / "traces" / trace
        remaining = deadline - time.time()
        if not trace_path.exists() or remaining < 20:
            continue
        out = costs_path.with_name(costs_path.stem + "_replay_" + trace_path.stem)  # the script adds .json, .md
        command = [sys.executable, str(ROOT / "benchmarks" / "replay_drafting.py"), str(trace_path),
                   "--costs", str(costs_path), "--verdict-on-device", "--out", str(out)]
        try:
            subprocess.run(command, capture_output=True, text=True, timeout=remaining - 10,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
            summary = json.loads(Path(f"{out}.json").read_text())  # not with_suffix: "qwen2.5-1.5b" has a dot
            found.append({"table": table, "trace": trace, "summary": summary.get("overall", summary.get("summary"))})
        except (subprocess.TimeoutExpired, OSError, ValueError) as error:
            found.append({"table": table, "trace": trace, "error": f"{type(error).__name__}: {error}"})
    return found


def write_results(results: dict, out_dir: Path, stem: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(results, indent=1))
    (out_dir / f"{stem}.md").write_text(markdown(results))
    return json_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (for a CPU check of the suite)")
    parser.add_argument("--context", type=int, default=None, help="cached tokens (default 1024; quick 128)")
    parser.add_argument("--num-tokens", type=int, default=None, help="timed tokens per rate (default 128; quick 16)")
    parser.add_argument("--budget-s", type=float, default=420, help="stop starting groups after this many seconds")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--groups", default=None, help="run only these groups of the plan (0-based, comma separated)")
    parser.add_argument("--variants", default=None, help="run only these decode steps of each group (comma separated)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.context = args.context or (128 if args.quick else 1024)
    args.num_tokens = args.num_tokens or (16 if args.quick else 128)
    if args.child:
        run_group(json.loads(args.child), args.device, args.context, args.num_tokens)
        return
    started = time.time()
    deadline = started + args.budget_s
    bandwidth, device_name, torch_version = measure_bandwidth(args.device)
    stem = "gpu_suite" if args.device != "cpu" else "gpu_suite_cpu"
    results = {"device": device_name, "torch": torch_version, "bandwidth_bytes_per_second": bandwidth,
               "context": args.context, "num_tokens": args.num_tokens, "rows": [], "seconds": 0.0}
    print(f"{device_name}: copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    try:
        results["draws"] = draws_check(args.device)
    except Exception as error:  # noqa: BLE001 - reported in the results, and the suite goes on
        results["draws"] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    print(f"device draws against the host's: {results['draws']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pocketspec_compile_") as cache_dir:
        plan = quick_plan() if args.quick else full_plan()
        if args.groups:
            plan = [plan[int(index)] for index in args.groups.split(",")]
        if args.variants:
            kept = args.variants.split(",")
            plan = [{**group, "variants": [variant for variant in group["variants"] if variant in kept]}
                    for group in plan]
            plan = [group for group in plan if group["variants"]]
        for group in plan:
            remaining = deadline - time.time()
            if remaining < 30:
                results["rows"].append({"model": group["model"], "weights": group["weights"],
                                        "variant": ",".join(group["variants"]), "error": "skipped: out of budget"})
                continue
            rows = run_child({**group, "bandwidth": bandwidth}, args, remaining, Path(cache_dir))
            results["rows"] += rows
            results["seconds"] = time.time() - started
            write_results(results, args.out_dir, stem)
    results["predicted"] = []
    for row in results["rows"]:
        if "verify" in row and "error" not in row and row["variant"] == "compiled":  # the default step's
            costs_path = args.out_dir / f"{stem}_costs_{row['model']}_{row['weights']}.json"
            costs_path.write_text(json.dumps(cost_table(row, device_name), indent=1))
            results["predicted"] += predicted_speedups(costs_path, f"{row['model']} {row['weights']}", deadline + 60)
    results["seconds"] = time.time() - started
    json_path = write_results(results, args.out_dir, stem)
    print((args.out_dir / f"{stem}.md").read_text())
    print(f"results: {json_path}")


if __name__ == "__main__":
    main()
