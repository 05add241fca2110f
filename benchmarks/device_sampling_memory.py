"""What a sampled verify on the device holds beside its logits, against the torch plan's term for it.

    .venv/bin/python benchmarks/device_sampling_memory.py [--device cpu|cuda] [--out benchmarks/results/...]

A static step (pocketspec/torch_model/static_step.py) samples on the model's device
(pocketspec/torch_model/device_sampling.py): float64 distributions, top-p's sort and the race's hashed
uniforms over [rows, vocab]. For each vocabulary (SmolLM2, Llama 3, Qwen2.5), verify width and top-p it
runs one sampled verify of float32 logits and measures its peak beyond them: on a GPU the allocator's
(torch.cuda.max_memory_allocated) in this process; on a CPU the peak RSS (ru_maxrss) of a fresh process
whose large allocations glibc maps and unmaps one by one (MALLOC_MMAP_THRESHOLD_), so that freed
temporaries are not kept in its heap. Beside it: memplanner.torch_peak.device_sampling_bytes, the
plan's term, and the milliseconds of one call (median). Writes device_sampling_memory_<device>.json/.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCABULARIES = {"smollm2": 49_152, "llama-3": 128_256, "qwen2.5": 151_936}
WIDTHS = (2, 8, 16, 33)  # rows of a verify: the drafted tokens and the bonus
TOP_PS = (1.0, 0.95)
TEMPERATURE = 0.8
REPEATS = 5


def measure(device_name: str, rows: int, vocab_size: int, top_p: float) -> dict:
    """One sampled verify's peak bytes beyond its inputs and its median milliseconds, in this process."""
    import numpy as np
    import torch

    from pocketspec.settings import SamplingSettings
    from pocketspec.torch_model import device_sampling

    device = torch.device(device_name)
    sampling = SamplingSettings(temperature=TEMPERATURE, top_p=top_p, seed=1)
    generator = torch.Generator().manual_seed(rows)
    logits = (torch.randn(rows, vocab_size, generator=generator) * 4).to(device)
    keys = (torch.arange(rows, dtype=torch.long) * 7919 + 11).to(device)
    draft = torch.zeros(rows - 1, dtype=torch.long, device=device)

    def run() -> None:
        device_sampling.verify(draft, logits, sampling, keys).cpu()  # .cpu(): the caller's one read

    one_row = torch.randn(1, vocab_size, generator=generator).to(device)  # code paths and thread pools touched
    for _ in range(2):
        device_sampling.verify(draft[:0], one_row, sampling, keys[:1]).cpu()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        run()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    seconds = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return {"peak_bytes": int(peak), "ms": round(1e3 * float(np.median(seconds)), 3)}


def measure_in_child(rows: int, vocab_size: int, top_p: float) -> dict:
    """measure() on the CPU, in a fresh process whose freed temporaries leave its RSS."""
    command = [sys.executable, __file__, "--child", json.dumps([rows, vocab_size, top_p])]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        rows, vocab_size, top_p = json.loads(args.child)
        print(json.dumps(measure("cpu", rows, vocab_size, top_p)))
        return
    from apps.report import write_results
    from memplanner.torch_peak import GPU_SAMPLING_TEMPORARIES, SAMPLING_TEMPORARIES, device_sampling_bytes
    from pocketspec.machine_report import cpu_name

    records = []
    for name, vocab_size in VOCABULARIES.items():
        for rows in WIDTHS:
            for top_p in TOP_PS:
                found = (measure_in_child(rows, vocab_size, top_p) if args.device == "cpu"
                         else measure(args.device, rows, vocab_size, top_p))
                planned = device_sampling_bytes(vocab_size, rows, on_gpu=args.device != "cpu")
                unit = rows * vocab_size * 8
                records.append({"vocabulary": name, "vocab_size": vocab_size, "rows": rows, "top_p": top_p,
                                **found, "planned_bytes": planned, "measured_units": found["peak_bytes"] / unit})
                print(f"{name} rows {rows} top_p {top_p}: {found['peak_bytes'] / 2**20:.1f} MiB "
                      f"({found['peak_bytes'] / unit:.2f} x rows x vocab x 8), planned {planned / 2**20:.1f} MiB, "
                      f"{found['ms']} ms", file=sys.stderr)
    device = args.device if args.device == "cpu" else args.device.replace(":", "")
    over = [r for r in records if r["peak_bytes"] > r["planned_bytes"]]
    machine = cpu_name() if args.device == "cpu" else device
    rows = [[r["vocabulary"], r["rows"], r["top_p"], f"{r['peak_bytes'] / 2**20:.1f}", f"{r['measured_units']:.2f}",
             f"{r['planned_bytes'] / 2**20:.1f}", r["ms"]] for r in records]
    notes = [f"{machine}; temperature {TEMPERATURE}; peak = {'ru_maxrss of a fresh process (MALLOC_MMAP_THRESHOLD_=65536)' if args.device == 'cpu' else 'torch.cuda.max_memory_allocated'} beyond the float32 logits",
             f"planned = memplanner.torch_peak.device_sampling_bytes: "
             f"{SAMPLING_TEMPORARIES if args.device == 'cpu' else GPU_SAMPLING_TEMPORARIES} x rows x vocab x 8",
             f"measured above the plan: {len(over)} of {len(records)}"]
    write_results(args.out or ROOT / "benchmarks" / "results", f"device_sampling_memory_{device}",
                  {"device": args.device, "temperature": TEMPERATURE, "records": records},
                  "A sampled verify's device temporaries against the plan",
                  ["vocabulary", "rows", "top-p", "peak MiB", "× rows·vocab·8", "planned MiB", "ms"], rows, notes)


if __name__ == "__main__":
    main()
