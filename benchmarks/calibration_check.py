"""The calibrated cost table against llama.cpp's own llama-bench, on the same machine and in one run.

    .venv/bin/python benchmarks/calibration_check.py [--model qwen2.5-coder-1.5b-instruct] [--threads 2] \
        [--depth 512] [--rounds 3] [--out benchmarks/results/calibration_check]

For each width it reports these costs, in ms and × one row, each by the calibration's own statistic over
rounds that measure every system once, one after another:
- llama-bench `-p W -n 0 -d DEPTH` (its prompt test: logits of the last row only), as `make peers` builds
  it: stock llama.cpp, whose batched kernels are not PocketSpec's;
- the same llama-bench built with PocketSpec's row-exact patch, the kernels a verify runs, when
  `POCKETSPEC_TOOLS_ROW_EXACT=1 native/build_llama_tools.sh .venv/bin/pip` has built it: the check of the
  measuring method compares with this one where it is there (it needs no `make peers`, whose llama-server
  takes long to build);
- PocketSpec's calibration (pocketspec/calibrate.py) asking for the last row's logits, as llama-bench
  does: the like-for-like check of the measuring method;
- PocketSpec's calibration asking for every row's logits, as a verify does: what the controller
  uses. The difference is the output head's cost for the other rows (a matmul over the vocabulary
  per row) and copying their logits out.
The like-for-like columns divide the calibration's last-row costs by the row-exact llama-bench's, in ms
and × one row. Either llama-bench will do. Run it on a quiet machine (no helper, no build).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.bench.peers.llama_speculative import default_tools_dir  # noqa: E402
from apps.report import write_results  # noqa: E402
from pocketspec.calibrate import measure_costs  # noqa: E402
from pocketspec.cost_samples import NUM_ROUNDS, relative_spread, robust_cost  # noqa: E402
from pocketspec.models.catalog import model_path  # noqa: E402
from pocketspec.settings import ModelSettings  # noqa: E402

WIDTHS = (1, 2, 4, 8, 16, 32)
LLAMA_BENCH_RUNS_PER_ROUND = 3  # llama-bench's -r in each round


def row_exact_tools_dir() -> Path:
    """Where native/build_llama_tools.sh puts llama-bench built with the row-exact patch."""
    stock = default_tools_dir()
    return stock.parent.with_name(f"{stock.parent.name}-row-exact") / stock.name


def llama_bench_round(binary: Path, model: Path, depth: int, num_threads: int) -> dict:
    """One llama-bench invocation over all the widths: each width's fastest of its runs (seconds)."""
    argv = [str(binary), "-m", str(model), "-t", str(num_threads), "-p", ",".join(map(str, WIDTHS)), "-n", "0",
            "-d", str(depth), "-r", str(LLAMA_BENCH_RUNS_PER_ROUND), "-o", "json"]
    tests = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return {int(test["n_prompt"]): min(test["samples_ns"]) / 1e9 for test in tests}


def calibration_round(model: Path, settings: ModelSettings, depth: int, all_rows: bool) -> dict:
    """One calibration (pocketspec/calibrate.py, its own interleaved passes): each width's cost (seconds)."""
    from pocketspec.backends.torch_open import open_backend

    settings = replace(settings, max_logits_rows=max(WIDTHS) if all_rows else 1, max_context=depth + 2 * max(WIDTHS))
    with open_backend(model, settings) as backend:
        costs = measure_costs(backend, max_width=max(WIDTHS), depths=(depth,))
    return {width: costs.seconds[depth][width] for width in WIDTHS}


def interleaved_costs(systems: dict, num_rounds: int) -> dict:
    """Every system measured once per round, the rounds one after another, so a busy spell on a shared machine
    slows one round of several systems, not every round of one; each width's cost by the calibration's own
    statistic (pocketspec/cost_samples.py): its fastest round, its spread how much slower the second fastest was."""
    samples = {name: {width: [] for width in WIDTHS} for name in systems}
    for _ in range(num_rounds):
        for name, measure in systems.items():
            for width, seconds in measure().items():
                samples[name][width].append(seconds)
    return {name: {width: {"seconds": robust_cost(values), "spread": relative_spread(values)}
                   for width, values in by_width.items()} for name, by_width in samples.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="a catalog name or a GGUF path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depth", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=NUM_ROUNDS, help="rounds of every system, one after another")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "calibration_check")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    model = Path(args.model) if Path(args.model).exists() else model_path(args.model)
    settings = ModelSettings(num_threads=args.threads)
    stock, row_exact = default_tools_dir() / "llama-bench", row_exact_tools_dir() / "llama-bench"
    benches = {name: binary for name, binary in (("llama-bench", stock), ("llama-bench, row-exact kernels", row_exact))
               if binary.exists()}
    if not benches:
        raise SystemExit(f"{stock} not found: run `make peers` first (or build the row-exact llama-bench alone, "
                         "as this file's docstring says)")
    systems = {name: partial(llama_bench_round, binary, model, args.depth, args.threads)
               for name, binary in benches.items()}
    systems["calibration, last row's logits"] = partial(calibration_round, model, settings, args.depth, all_rows=False)
    systems["calibration, every row's logits"] = partial(calibration_round, model, settings, args.depth, all_rows=True)
    measured = interleaved_costs(systems, args.rounds)
    reference = list(benches)[-1]  # the kernels the calibration runs, where that llama-bench was built
    like_for_like = "calibration, last row's logits"  # the logits llama-bench asks for
    columns = ["rows", *[f"{name} × one row" for name in measured], f"last row's logits / {reference}, × one row",
               f"last row's logits / {reference}, ms", *[f"{name} ms ± spread" for name in measured]]
    rows = []
    for width in WIDTHS:
        ratios = {name: values[width]["seconds"] / values[1]["seconds"] for name, values in measured.items()}
        rows.append([width, *[f"{ratio:.2f}" for ratio in ratios.values()],
                     f"{ratios[like_for_like] / ratios[reference]:.2f}",
                     f"{measured[like_for_like][width]['seconds'] / measured[reference][width]['seconds']:.2f}",
                     *[f"{1000 * values[width]['seconds']:.0f} ± {values[width]['spread']:.0%}"
                       for values in measured.values()]])
    notes = [f"model {model.name}, {args.threads} threads, {args.depth} cached tokens",
             f"{args.rounds} rounds, each measuring every system once (llama-bench: one invocation, "
             f"{LLAMA_BENCH_RUNS_PER_ROUND} runs of each width; calibration: one calibration, its own interleaved "
             f"passes); a width's cost is its fastest round, its spread how much slower the second fastest round was "
             f"(pocketspec/cost_samples.py)"]
    write_results(args.out.parent, args.out.name, {"widths": list(WIDTHS), "measured": measured},
                  "Calibrated cost table against llama-bench", columns, rows, notes)
    print((args.out.parent / f"{args.out.name}.md").read_text())


if __name__ == "__main__":
    main()
