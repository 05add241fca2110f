"""Where a GPU decode step's time goes: its kernels, by name, per step, under torch.profiler.

    PYTHONPATH=. python3 benchmarks/gpu_step_profile.py qwen2.5-1.5b:bf16:compiled smollm2-135m:bf16:compiled
    PYTHONPATH=. python3 benchmarks/gpu_step_profile.py tiny:fp32:compiled --device cpu --context 64   # a CPU check

Each spec is model:weights:variant (the GPU suite's models and decode steps, random weights of
real shapes, benchmarks/gpu_suite_group.py opens them). For each it times greedy decoding one
token a step after --context cached tokens, then profiles --steps such steps twice: replaying
the captured CUDA graphs (what a user runs), and launching the same step's kernels one by one
(graphs off), since a profiler may not see inside a graph. Per step it reports the kernels
launched, their summed GPU time beside the step's wall time, and the kernels that cost most.
Results: DIR/gpu_step_profile.json and .md (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TOP_KERNELS = 14


def _profile_steps(backend, num_steps: int) -> dict:
    """Kernels per step (count and µs by name) over num_steps greedy one-token steps."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from pocketspec.settings import SamplingSettings
    from pocketspec.speculation.draws import SeededDraws

    greedy, draws = SamplingSettings(temperature=0.0), SeededDraws(0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if backend.device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        for _ in range(num_steps):
            backend.choose([7], greedy, draws)
        if backend.device.type == "cuda":
            torch.cuda.synchronize(backend.device)
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in profiler.events():
        if event.device_type == DeviceType.CUDA:
            by_name[event.name][0] += 1
            by_name[event.name][1] += event.time_range.elapsed_us()
    kernels = sorted(((name, count / num_steps, micros / num_steps) for name, (count, micros) in by_name.items()),
                     key=lambda item: -item[2])
    return {"kernels_per_step": round(sum(count for _, count, _ in kernels), 1),
            "kernel_us_per_step": round(sum(micros for _, _, micros in kernels), 1),
            "top": [{"name": name[:110], "per_step": round(count, 2), "us_per_step": round(micros, 1)}
                    for name, count, micros in kernels[:TOP_KERNELS]]}


def profile_spec(spec: str, device_name: str, context: int, num_steps: int) -> dict:
    import torch

    import torch_gpu_roofline as roofline
    from gpu_suite_group import _decode_rate, _open_backend, model_config

    model_name, weights, variant = spec.split(":")
    device = torch.device(device_name)
    config = model_config(model_name)
    model = roofline.random_model(config, weights, device)
    backend, open_seconds = _open_backend(model, config, weights, device_name, variant, context + 4 * num_steps + 64, 1)
    rate = _decode_rate(backend, context, 4 * num_steps)
    row = {"spec": spec, "open_seconds": round(open_seconds, 1), "tokens_per_second": round(rate, 1),
           "step_ms": round(1e3 / rate, 3)}
    backend.rollback(0)
    backend.prefill([7] * context)
    row["graphs"] = _profile_steps(backend, num_steps)
    step = backend.static_step
    if step is not None and step.captures:
        step.captures = False
        backend.rollback(context)
        row["launched"] = _profile_steps(backend, num_steps)
        step.captures = True
    backend.close()
    del backend, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def markdown(results: dict) -> str:
    lines = [f"# Decode step profile on {results['device']}", "",
             f"torch {results['torch']}; batch 1, context {results['context']}; {results['steps']} steps profiled.", ""]
    for row in results["rows"]:
        if "error" in row:
            lines += [f"## {row['spec']}", "", f"failed: {row['error']}", ""]
            continue
        lines += [f"## {row['spec']}: {row['tokens_per_second']} tok/s, {row['step_ms']} ms a step "
                  f"(opened in {row['open_seconds']} s)", ""]
        for mode in ("graphs", "launched"):
            if mode not in row:
                continue
            found = row[mode]
            lines += [f"{mode}: {found['kernels_per_step']} kernels a step, "
                      f"{found['kernel_us_per_step']} µs of kernels",
                      "", "| kernel | per step | µs per step |", "|---|---|---|"]
            lines += [f"| `{kernel['name']}` | {kernel['per_step']} | {kernel['us_per_step']} |"
                      for kernel in found["top"]]
            lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help="model:weights:variant")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    import torch

    results = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
               "context": args.context, "steps": args.steps, "rows": []}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for spec in args.specs:
        started = time.perf_counter()
        try:
            results["rows"].append(profile_spec(spec, args.device, args.context, args.steps))
        except Exception as error:  # noqa: BLE001 - one failed spec leaves the others' rows
            results["rows"].append({"spec": spec, "error": f"{type(error).__name__}: {str(error)[:300]}"})
        print(f"  {spec}: {time.perf_counter() - started:.0f} s", flush=True)
        (args.out_dir / "gpu_step_profile.json").write_text(json.dumps(results, indent=1))
        (args.out_dir / "gpu_step_profile.md").write_text(markdown(results))
    print((args.out_dir / "gpu_step_profile.md").read_text())


if __name__ == "__main__":
    main()
