"""Where ONNX Runtime stands: --backend onnx (fp32, int4) against torch and llama.cpp, plain and speculative.

    python benchmarks/onnx_bench.py [--models smollm2-135m-instruct] [--drafters none ngram] [--rounds 2]
    python benchmarks/onnx_bench.py --models qwen2.5-coder-1.5b-instruct \
        --drafters none ngram qwen2.5-coder-0.5b-instruct --prompts 2 --max-tokens 64 --name onnx_bench_qwen

Each system decodes the same held-out code edits (benchmarks/data/code_edit.jsonl, greedy) in a fresh
process of its own, so its peak resident memory is its own; systems alternate within each round. Exports
are made first, in their own processes, so no measured peak includes an export. Writes
benchmarks/results/onnx_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_process import ROOT, answer_if_worker, run_worker  # noqa: E402

SYSTEMS = [  # (label, backend, weights)
    ("llama.cpp (GGUF as pulled)", "llama.cpp", "auto"),
    ("torch fp32", "torch", "fp32"),
    ("onnx fp32", "onnx", "fp32"),
    ("onnx int4", "onnx", "int4"),
]
COLUMNS = ["model", "system", "drafter", "decode tok/s (median of rounds)", "× plain on the same backend",
           "acceptance", "peak RSS GiB", "equal to its plain"]


def worker(config: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    from pocketspec.session import open_session
    from pocketspec.session_settings import SessionSettings

    options = {"backend": config["backend"]}
    if config["backend"] != "llama.cpp":
        options["weights"] = config["weights"]
    settings = SessionSettings(target=config["model"], draft=config["drafter"], threads=config["threads"],
                               max_context=config["max_context"], options=options)
    with open_session(settings) as session:
        if config.get("prepare_only"):
            return {}
        session.engine.generate(session.encode("Hello", chat=True), 8)  # first-call work is not timed
        outputs, tokens, seconds, drafted, accepted = [], 0, 0.0, 0, 0
        for prompt in config["prompts"]:
            result = session.engine.generate(session.encode(prompt, chat=True), config["max_tokens"])
            outputs.append(result.tokens)
            tokens += len(result.tokens)
            seconds += result.stats.decode_seconds
            drafted += result.stats.num_drafted
            accepted += result.stats.num_accepted
        return {"decode_tokens_per_second": tokens / seconds, "outputs": outputs,
                "acceptance": accepted / drafted if drafted else None, "peak_bytes": session.peak_memory_bytes()}


def held_out_prompts(count: int) -> list[str]:
    lines = (ROOT / "benchmarks" / "data" / "code_edit.jsonl").read_text().splitlines()
    return [json.loads(line)["turns"][0] for line in lines[:count]]


def main() -> None:
    answer_if_worker(worker)
    sys.path.insert(0, str(ROOT))
    from apps.report import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct"])
    parser.add_argument("--drafters", nargs="+", default=["none", "ngram"],
                        help="--draft values: none (plain, the baseline), ngram, or a draft model")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--name", default="onnx_bench")
    args = parser.parse_args()
    prompts = held_out_prompts(args.prompts)
    base = {"prompts": prompts, "max_tokens": args.max_tokens, "threads": args.threads,
            "max_context": args.max_context}
    runs: dict[tuple, list[dict]] = {}
    for model in args.models:
        for label, backend, weights in SYSTEMS:
            if backend == "onnx":
                print(f"exporting {model} ({weights}) if not cached", file=sys.stderr)
                for drafter in args.drafters:  # a draft model is exported too
                    run_worker(__file__, {**base, "model": model, "backend": backend, "weights": weights,
                                          "drafter": drafter, "prepare_only": True}, what=f"{label} export")
        for round_index in range(args.rounds):
            for label, backend, weights in SYSTEMS:
                for drafter in args.drafters:
                    print(f"round {round_index + 1}: {model} {label} {drafter}", file=sys.stderr)
                    config = {**base, "model": model, "backend": backend, "weights": weights, "drafter": drafter}
                    runs.setdefault((model, label, drafter), []).append(
                        run_worker(__file__, config, what=f"{label} {drafter}"))
    rows, points = [], []
    for (model, label, drafter), results in runs.items():
        rate = statistics.median(result["decode_tokens_per_second"] for result in results)
        plain = runs[(model, label, "none")]
        plain_rate = statistics.median(result["decode_tokens_per_second"] for result in plain)
        is_equal = all(result["outputs"] == plain[0]["outputs"] for result in results)
        acceptance = results[0]["acceptance"]
        peak = max(result["peak_bytes"] for result in results)
        points.append({"model": model, "system": label, "drafter": drafter, "decode_tokens_per_second": rate,
                       "rounds": [result["decode_tokens_per_second"] for result in results],
                       "speedup": rate / plain_rate, "acceptance": acceptance, "peak_bytes": peak,
                       "equal_to_plain": is_equal})
        rows.append([model, label, drafter, f"{rate:.1f}", f"{rate / plain_rate:.2f}×",
                     "–" if acceptance is None else f"{acceptance:.0%}", f"{peak / 2 ** 30:.2f}",
                     "yes" if is_equal else "no"])
    threads = args.threads or len(os.sched_getaffinity(0))
    description = (f"{len(prompts)} held-out code edits, greedy, {args.max_tokens} new tokens, {threads} threads, "
                   f"context {args.max_context}, {args.rounds} rounds")
    write_results(ROOT / "benchmarks" / "results", args.name,
                  {"config": vars(args), "description": description, "points": points},
                  f"ONNX Runtime against torch and llama.cpp: {description}", COLUMNS, rows,
                  notes=["decode tok/s: generated tokens over decode time (prefill excluded), summed over the prompts",
                         "llama.cpp runs the GGUF's own quantization (SmolLM2: Q4_1; qwen-coder: Q4_K_M); torch and "
                         "onnx fp32 dequantize it to fp32; onnx int4 requantizes that to MatMulNBits (4 bits, "
                         "blocks of 32)",
                         "equal to its plain: the speculative output equals the same backend's plain output"])
    print(f"wrote {ROOT / 'benchmarks' / 'results' / args.name}.{{json,md}}")


if __name__ == "__main__":
    main()
