"""The torch backend's weight formats on a CPU: plain SmolLM2 decoding in fp32, int8 and int4, interleaved.

    .venv/bin/python benchmarks/torch_weights_bench.py [--weights fp32 int8 int4] [--threads 2]
                                                      [--num-prompts 4] [--max-tokens 64] [--rounds 2]

One process loads SmolLM2-135M once per format, then for each round and prompt decodes
the prompt greedily with every format in turn (plain, no draft), so a noisy shared
machine slows all formats alike. It records decode tok/s (the tokens after the first),
prefill tok/s, whether each format's tokens equal fp32's, the weights' bytes and the
median one-token forward. Ratios against fp32 are taken per (round, prompt) pair, then
the median. int8 and int4 run torch's fused weight-only kernels
(pocketspec/torch_model/quant_kernels.py).
Results: benchmarks/results/torch_weights_bench.{json,md} (or --name).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.prompt_file import read_prompt_rows  # noqa: E402

DATA_PATH = ROOT / "benchmarks" / "data" / "spec_bench.jsonl"
RESULTS = ROOT / "benchmarks" / "results"
MODEL = "smollm2-135m-instruct"
CATEGORIES = ("writing", "coding", "stem", "humanities", "roleplay", "extraction", "reasoning", "math")


def _questions(num_prompts: int) -> list[str]:
    """The first question of each category, in CATEGORIES order."""
    firsts = {}
    for row in read_prompt_rows(DATA_PATH, "Spec-Bench"):
        firsts.setdefault(row.category, row.text)
    return [firsts[category] for category in CATEGORIES[:num_prompts]]


def _one_token_ms(backend, num_repeats: int = 16) -> float:
    """Median milliseconds of a one-token forward at the backend's current position."""
    num_kept = backend.num_cached - 1
    seconds = []
    for _ in range(num_repeats):
        backend.rollback(num_kept)
        started = time.perf_counter()
        backend.forward([backend.cached_tokens[-1]], [0])
        seconds.append(time.perf_counter() - started)
    backend.rollback(num_kept)
    return 1000 * statistics.median(seconds)


def run(args) -> dict:
    import torch

    from pocketspec.backends.torch_backend import TorchBackend
    from pocketspec.models.catalog import model_path
    from pocketspec.conversation.chat_template import encode_chat, template_for
    from pocketspec.speculation.engine import SpeculativeEngine
    from pocketspec.settings import ModelSettings, SpeculationSettings

    backends = {}
    for weights in args.weights:
        settings = ModelSettings(backend="torch", weights=weights, max_context=1024, num_threads=args.threads)
        backends[weights] = TorchBackend.open(model_path(MODEL), settings)
    tokenizer = next(iter(backends.values())).tokenizer
    prompts = [encode_chat(tokenizer, template_for(tokenizer), [{"role": "user", "content": question}])
               for question in _questions(args.num_prompts)]
    plain = SpeculationSettings(drafter="none")
    runs = []
    for round_index in range(args.rounds):
        for prompt_index, prompt in enumerate(prompts):
            for weights, backend in backends.items():
                backend.rollback(0)
                result = SpeculativeEngine(backend, speculation=plain).generate(prompt, args.max_tokens)
                stats = result.stats
                runs.append({"round": round_index, "prompt": prompt_index, "weights": weights,
                             "num_prompt_tokens": len(prompt), "num_tokens": stats.num_tokens,
                             "decode_tokens_per_second": round(stats.decode_tokens_per_second, 3),
                             "prefill_tokens_per_second": round(len(prompt) / stats.prefill_seconds, 1),
                             "one_token_ms": round(_one_token_ms(backend), 3), "tokens": result.tokens})
            print(" ".join(f"{row['weights']} {row['decode_tokens_per_second']:.1f}" for row in runs[-len(backends):]),
                  flush=True)
    formats = {}
    for weights, backend in backends.items():
        mine = [row for row in runs if row["weights"] == weights]
        fp32 = [row for row in runs if row["weights"] == "fp32"]
        formats[weights] = {
            "weight_bytes": backend.memory_report()["weights"],
            "median_decode_tokens_per_second": round(statistics.median(r["decode_tokens_per_second"] for r in mine), 2),
            "median_prefill_tokens_per_second": round(statistics.median(r["prefill_tokens_per_second"] for r in mine), 1),
            "median_one_token_ms": round(statistics.median(r["one_token_ms"] for r in mine), 2),
            "median_decode_ratio_to_fp32": round(statistics.median(
                r["decode_tokens_per_second"] / f["decode_tokens_per_second"] for r, f in zip(mine, fp32)), 3)
            if fp32 else None,
            "num_runs_equal_to_fp32": sum(r["tokens"] == f["tokens"] for r, f in zip(mine, fp32)) if fp32 else None,
        }
        backend.close()
    for row in runs:
        del row["tokens"]
    return {"machine": f"{platform.machine()} CPU, {len(os.sched_getaffinity(0))} cores",
            "torch": torch.__version__, "model": MODEL, "threads": args.threads, "max_tokens": args.max_tokens,
            "rounds": args.rounds, "num_prompts": len(prompts), "formats": formats, "runs": runs}


def _markdown(results: dict) -> str:
    lines = [f"# Torch backend on CPU: {results['model']} weight formats, plain decoding", "",
             f"{results['machine']}; torch {results['torch']}; {results['threads']} threads; "
             f"{results['max_tokens']} new tokens; {results['num_prompts']} prompts x {results['rounds']} rounds, "
             "formats interleaved per prompt. Ratio: median over (round, prompt) of decode tok/s / fp32's.", "",
             "| weights | weights MiB | decode tok/s | ratio to fp32 | prefill tok/s | one-token forward ms "
             "| runs = fp32 tokens |", "|---|---|---|---|---|---|---|"]
    num_runs = results["rounds"] * results["num_prompts"]
    for weights, row in results["formats"].items():
        lines.append(f"| {weights} | {row['weight_bytes'] / 2 ** 20:.1f} | {row['median_decode_tokens_per_second']:.2f} "
                     f"| {row['median_decode_ratio_to_fp32']} | {row['median_prefill_tokens_per_second']:.0f} "
                     f"| {row['median_one_token_ms']:.2f} | {row['num_runs_equal_to_fp32']} / {num_runs} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="+", default=["fp32", "int8", "int4"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=4, choices=range(1, len(CATEGORIES) + 1))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--name", default="torch_weights_bench", help="results file stem under benchmarks/results")
    args = parser.parse_args()
    results = run(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (RESULTS / f"{args.name}.md").write_text(_markdown(results))
    print(_markdown(results))


if __name__ == "__main__":
    main()
