"""Plain decoding with and without huge pages (pocketspec/huge_pages.py), in alternating pairs.

    .venv/bin/python benchmarks/huge_pages_bench.py [--pairs 4] [--model qwen2.5-coder-1.5b-instruct] [--llama-bench]

Each pair runs `pocketspec generate --draft none` twice in fresh processes, once as the CLI starts
by default (restarted with glibc.malloc.hugetlb=1) and once with POCKETSPEC_HUGE_PAGES=0, the order
swapped every pair so that a drift of the machine falls on both. It records decode tok/s, the
one-token step and the peak RSS of each, and the ratio within each pair. --llama-bench adds
llama.cpp's own `llama-bench tg` with and without the tunable, in the same alternation.
Results: benchmarks/results/huge_pages_bench.{json,md} (or --name).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.report import markdown_table, write_results  # noqa: E402
from pocketspec.machine_report import cpu_name  # noqa: E402
from pocketspec.huge_pages import (OPT_OUT_VARIABLE, TUNABLES_VARIABLE, current_state,  # noqa: E402
                                   environment_with_huge_pages, thp_mode)

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
MODES = ("huge pages", "4 KiB pages")


def _environment(mode: str, *, is_pocketspec: bool) -> dict[str, str]:
    """This environment without any huge-page setting, then set for `mode`: PocketSpec adds the
    tunable itself unless told POCKETSPEC_HUGE_PAGES=0; another program is given it."""
    environment = {key: value for key, value in os.environ.items() if key not in (TUNABLES_VARIABLE, OPT_OUT_VARIABLE)}
    if is_pocketspec:
        return environment if mode == "huge pages" else {**environment, OPT_OUT_VARIABLE: "0"}
    return environment_with_huge_pages(environment) if mode == "huge pages" else environment


def _generate(mode: str, args) -> dict:
    done = subprocess.run([sys.executable, "-m", "apps.cli", "generate", "--target", args.model, "--draft", "none",
                           "--prompt", PROMPT, "--max-tokens", str(args.max_tokens), "--threads", str(args.threads),
                           "--json"], cwd=ROOT, env=_environment(mode, is_pocketspec=True), capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"error: generate ({mode}) failed: {done.stderr.strip()[-400:]}")
    stats = json.loads(done.stdout)["stats"]
    return {"tokens_per_second": stats["decode_tokens_per_second"], "step_ms": 1000 * stats["plain_step_seconds"],
            "peak_bytes": stats["peak_memory_bytes"]}


def _llama_bench(mode: str, args) -> dict:
    from apps.bench.peers.llama_speculative import default_tools_dir
    from pocketspec.models.catalog import model_path

    done = subprocess.run([str(default_tools_dir() / "llama-bench"), "-m", str(model_path(args.model)), "-p", "0",
                           "-n", "128", "-t", str(args.threads), "-r", "2", "-o", "json"],
                          env=_environment(mode, is_pocketspec=False), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"error: llama-bench ({mode}) failed: {done.stderr.strip()[-400:]}")
    return {"tokens_per_second": float(json.loads(done.stdout)[0]["avg_ts"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-bench", action="store_true", help="also llama.cpp's llama-bench (make peers)")
    parser.add_argument("--name", default="huge_pages_bench")
    args = parser.parse_args()
    if thp_mode() != "madvise":
        raise SystemExit(f"error: nothing to compare here: huge pages are {current_state()}")
    runners = {"pocketspec generate --draft none": _generate}
    if args.llama_bench:
        runners["llama-bench tg128"] = _llama_bench
    pairs = []
    for index in range(args.pairs):
        order = MODES if index % 2 == 0 else MODES[::-1]
        for system, run in runners.items():
            measured = {mode: run(mode, args) for mode in order}
            pairs.append({"system": system, "pair": index, "first": order[0], **measured})
            print(f"{system} pair {index}: " + ", ".join(f"{mode} {measured[mode]['tokens_per_second']:.2f} tok/s"
                                                          for mode in MODES), flush=True)
    rows, summary = [], {}
    for system in runners:
        mine = [pair for pair in pairs if pair["system"] == system]
        ratios = [pair["huge pages"]["tokens_per_second"] / pair["4 KiB pages"]["tokens_per_second"] for pair in mine]
        summary[system] = {"mean_ratio": statistics.mean(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
                           "num_faster": sum(ratio > 1 for ratio in ratios), "num_pairs": len(ratios)}
        for mode in MODES:
            values = [pair[mode] for pair in mine]
            peaks = [value["peak_bytes"] for value in values if "peak_bytes" in value]
            steps = [value["step_ms"] for value in values if "step_ms" in value]
            rows.append([system, mode, statistics.mean(value["tokens_per_second"] for value in values),
                         f"{statistics.mean(steps):.2f}" if steps else "–",
                         f"{statistics.mean(peaks) / 2**20:.0f}" if peaks else "–",
                         f"{summary[system]['mean_ratio']:.3f} ({summary[system]['min_ratio']:.3f}–"
                         f"{summary[system]['max_ratio']:.3f})" if mode == "huge pages" else "1"])
    cpu = cpu_name()
    notes = [f"CPU: {cpu}, {args.threads} threads; model {args.model}; {args.max_tokens} new tokens; "
             f"{args.pairs} pairs, order swapped every pair, each run a fresh process.",
             "Ratio: huge pages over 4 KiB pages within each pair, mean (min–max)."]
    notes += [f"{system}: faster with huge pages in {value['num_faster']} of {value['num_pairs']} pairs"
              for system, value in summary.items()]
    paths = write_results(ROOT / "benchmarks" / "results", args.name,
                          {"cpu": cpu, "settings": vars(args), "pairs": pairs, "summary": summary},
                          "Decoding with and without huge pages", ["system", "pages", "tok/s", "step ms", "peak MiB",
                                                                   "× 4 KiB pages"], rows, notes)
    print(markdown_table(["system", "pages", "tok/s", "step ms", "peak MiB", "× 4 KiB pages"], rows))
    print(f"results: {paths[0]} and {paths[1]}")


if __name__ == "__main__":
    main()
