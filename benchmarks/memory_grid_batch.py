"""The torch batch plan against real `generate --batch` runs on a CPU: predicted peak against the process's peak RSS.

    .venv/bin/python benchmarks/memory_grid_batch.py [--only 0 2]

Each configuration (weights format x context x rows) runs `pocketspec generate --backend torch --batch N
--draft self-sparse` in a fresh process over N prompts that fill the context, with a budget equal to the
batch plan's predicted peak plus the heap reserve it keeps free (the least budget that still gives every
row). Where the batch's forward costs are not cached yet, `pocketspec doctor --calibrate --batch N` times
them first in a process of its own, so the self-sparse draft runs as a calibrated user's would (without
costs the controller may never draft). The measured peak is the largest `peak_rss_bytes` of the output
lines: the process's VmHWM. Results go to benchmarks/results/memory_grid_batch_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from memory_grid_torch import prompt_text  # noqa: E402

MODEL = "smollm2-135m-instruct"
NEW_TOKENS = 32
# (weights, context, rows): both CPU formats, a short and a longer context, a full and a small pool
CONFIGS = [("int8", 640, 16), ("fp32", 640, 16), ("int8", 2048, 8), ("fp32", 2048, 4), ("int8", 2048, 16)]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli", *args], cwd=ROOT, text=True, capture_output=True)


def _plan(pool: list[str], budget: str) -> dict:
    done = _cli("plan", *pool, "--memory-budget", budget, "--json")
    if done.returncode != 0:
        raise SystemExit(f"pocketspec plan failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def run(weights: str, context: int, rows: int) -> dict:
    from memplanner.torch_peak import heap_reserve_bytes

    pool = ["--backend", "torch", "--target", MODEL, "--draft", "self-sparse", "--weights", weights,
            "--batch", str(rows), "--max-context", str(context), "--threads", "2"]
    record = {"weights": weights, "context": context, "rows": rows}
    if not _plan(pool, "64GiB")["costs_measured"]:
        calibrated = _cli("doctor", "--calibrate", *pool)
        if calibrated.returncode != 0:
            return {**record, "error": calibrated.stderr.strip().splitlines()[-1:]}
    plan = _plan(pool, "64GiB")
    predicted = plan["predicted_peak_bytes"]
    budget = predicted + heap_reserve_bytes(on_gpu=False)
    text = prompt_text(MODEL, context - NEW_TOKENS - 16)  # room for the new tokens and a verify
    with tempfile.TemporaryDirectory() as folder:
        prompts, output = Path(folder) / "prompts.jsonl", Path(folder) / "out.jsonl"
        prompts.write_text("".join(json.dumps({"prompt": f"Request {index}.\n{text}"}) + "\n" for index in range(rows)))
        done = _cli("generate", *pool, "--prompt-file", str(prompts), "--max-tokens", str(NEW_TOKENS),
                    "--memory-budget", str(budget), "--output", str(output))
        if done.returncode != 0:
            return {**record, "error": done.stderr.strip().splitlines()[-1:]}
        lines = [json.loads(line) for line in output.read_text().splitlines()]
    measured = max(line["stats"]["peak_rss_bytes"] for line in lines)
    num_drafted = sum(line["stats"]["num_drafted"] for line in lines)
    record.update(predicted_peak_bytes=predicted, terms=plan["terms"], budget_bytes=budget,
                  measured_peak_bytes=measured, error_fraction=(predicted - measured) / measured,
                  within_budget=measured <= budget, num_drafted=num_drafted,
                  rows_kept=plan["num_rows"] == rows and plan["max_batch"] == rows)
    print(f"{weights:>5} ctx {context:>5} rows {rows:>2}: predicted {predicted / 2 ** 20:.0f} MiB, measured "
          f"{measured / 2 ** 20:.0f} MiB ({record['error_fraction']:+.1%}), drafted {num_drafted}", file=sys.stderr)
    return record


def write(records: list[dict]) -> Path:
    from apps.report import write_results

    measured = [r for r in records if "error" not in r]
    rows = [[r["weights"], r["context"], r["rows"], f"{r['predicted_peak_bytes'] / 2 ** 20:.0f} MiB",
             f"{r['measured_peak_bytes'] / 2 ** 20:.0f} MiB", f"{r['error_fraction']:+.1%}", r["num_drafted"],
             "yes" if r["within_budget"] else "NO"] for r in measured]
    notes = [f"{len(measured)} of {len(records)} configurations ran; over budget: "
             f"{sum(not r['within_budget'] for r in measured)}; under-predicted: "
             f"{sum(r['error_fraction'] < 0 for r in measured)}",
             f"{MODEL}, `generate --batch N --draft self-sparse`, {NEW_TOKENS} new tokens a prompt; budget = "
             "predicted peak + the CPU heap reserve; measured = the process's peak RSS (VmHWM)"]
    notes += [f"failed: {r['weights']} {r['context']} {r['rows']}: {r['error']}" for r in records if "error" in r]
    _, markdown = write_results(ROOT / "benchmarks" / "results", "memory_grid_batch_cpu", {"records": records},
                                "Torch batch plan vs measured (cpu)",
                                ["weights", "context", "rows", "predicted", "measured", "error", "drafted",
                                 "in budget"], rows, notes)
    return markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, nargs="+", help="Run only these configuration numbers (0-based).")
    args = parser.parse_args()
    records = []
    for index, config in enumerate(CONFIGS):
        if not args.only or index in args.only:
            records.append(run(*config))
            markdown = write(records)  # after each run: a stopped grid still reports
    print(markdown.read_text())


if __name__ == "__main__":
    main()
