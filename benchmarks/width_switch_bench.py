"""Does a verify cost more right after a pass of another width? llama.cpp, one model, one run.

    .venv/bin/python benchmarks/width_switch_bench.py [--model qwen2.5-coder-1.5b-instruct] [--threads 2] \
        [--depth 500] [--passes 24] [--rounds 3] [--out benchmarks/results/width_switch]

A speculative run alternates widths (one row, then γ + 1 rows, then one row), while the calibration
and llama-bench repeat one width. If llama.cpp rebuilt its graph or its output buffer whenever the
width changed, each switch would cost time that no cost table holds. For each pattern of widths
(one width repeated, two alternating, four rotating) this times every pass at a fixed depth, asking
for every row's logits as a verify does, and reports the median by width. Patterns run in turn,
`--rounds` times, so a busy spell touches all of them. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.report import write_results  # noqa: E402
from pocketspec.backends.llama_cpp_backend import LlamaCppBackend  # noqa: E402
from pocketspec.models.catalog import model_path  # noqa: E402
from pocketspec.settings import ModelSettings  # noqa: E402

PATTERNS = {"1 repeated": (1,), "2 repeated": (2,), "4 repeated": (4,), "1, 2 alternating": (1, 2),
            "1, 4 alternating": (1, 4), "1, 1, 1, 2": (1, 1, 1, 2), "1, 2, 3, 4 rotating": (1, 2, 3, 4)}
FILLER_TOKEN = 100


def timed_pass(backend: LlamaCppBackend, width: int, depth: int) -> float:
    """Seconds for one forward of `width` tokens after `depth` cached ones, every row's logits; then rolled back."""
    started = time.perf_counter()
    backend.forward([FILLER_TOKEN] * width, list(range(width)))
    seconds = time.perf_counter() - started
    backend.rollback(depth)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depth", type=int, default=500)
    parser.add_argument("--passes", type=int, default=24, help="timed passes of each pattern per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "width_switch")
    args = parser.parse_args()
    settings = ModelSettings(max_context=args.depth + 64, max_logits_rows=8, num_threads=args.threads)
    with LlamaCppBackend(model_path(args.model), settings) as backend:
        prompt = backend.tokenizer.encode("def fibonacci(n):\n    " * (args.depth // 4), add_bos=True)[:args.depth]
        backend.forward(prompt, [len(prompt) - 1])
        for width in (1, 2, 4, 1, 2, 4):  # warm-up, not timed
            timed_pass(backend, width, len(prompt))
        seconds: dict[str, dict[int, list[float]]] = {name: {} for name in PATTERNS}
        for _ in range(args.rounds):
            for name, pattern in PATTERNS.items():
                for index in range(args.passes):
                    width = pattern[index % len(pattern)]
                    seconds[name].setdefault(width, []).append(timed_pass(backend, width, len(prompt)))
    medians = {name: {width: 1000 * statistics.median(values) for width, values in sorted(by_width.items())}
               for name, by_width in seconds.items()}
    rows = [[name] + [f"{medians[name][width]:.1f}" if width in medians[name] else "" for width in (1, 2, 3, 4)]
            for name in PATTERNS]
    notes = [f"{args.model}, {args.threads} threads, {len(prompt)} cached tokens, every row's logits; "
             f"{args.passes} passes per pattern in each of {args.rounds} rounds; median ms by width"]
    write_results(args.out.parent, args.out.name, {"depth": len(prompt), "threads": args.threads,
                                                   "median_ms": medians},
                  "Verify cost after a pass of another width", ["pattern", "1 row", "2 rows", "3 rows", "4 rows"],
                  rows, notes)
    print("\n".join(" | ".join(row) for row in rows))


if __name__ == "__main__":
    main()
