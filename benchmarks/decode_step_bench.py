"""The torch backend's static decode step against its dynamic one, on a CPU or a GPU.

    .venv/bin/python benchmarks/decode_step_bench.py [--device cuda] [--compile] [--weights bf16]

Opens SmolLM2-135M (or --model) once per decode step (dynamic; static; with --compile, static
compiled: CUDA graphs on a GPU, warmed up for every bucket before anything is timed), then
decodes Spec-Bench questions with each, interleaved per prompt: plain and n-gram drafting at
temperature 0, and n-gram at temperature 1 (where the static step samples and verifies on the
device). It records decode tok/s, its ratio to the dynamic step's on the same prompt, the
device-to-host reads and bytes per step after the prompt (static: one read of a verdict, 16 bytes), and whether
greedy tokens equal the dynamic step's.
Results: benchmarks/results/decode_step_bench.{json,md} (or --name).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.prompt_file import read_prompt_rows  # noqa: E402
from apps.report import markdown_table, write_results  # noqa: E402

DATA_PATH = ROOT / "benchmarks" / "data" / "spec_bench.jsonl"
RESULTS = ROOT / "benchmarks" / "results"
CATEGORIES = ("writing", "coding", "stem", "humanities", "roleplay", "extraction", "reasoning", "math")
MODES = {"plain greedy": ("none", 0.0), "ngram greedy": ("ngram", 0.0), "ngram T=1": ("ngram", 1.0)}


def _questions(num_prompts: int) -> list[str]:
    firsts = {}
    for row in read_prompt_rows(DATA_PATH, "Spec-Bench"):
        firsts.setdefault(row.category, row.text)
    return [firsts[category] for category in CATEGORIES[:num_prompts]]


def _open_backends(args) -> dict:
    from pocketspec.backends.torch_backend import TorchBackend
    from pocketspec.models.catalog import model_path
    from pocketspec.settings import ModelSettings

    variants = {"dynamic": ("dynamic", False), "static": ("static", False)}
    if args.compile:
        variants["static compiled"] = ("static", True)
    backends = {}
    for name, (decode_step, compile) in variants.items():
        settings = ModelSettings(backend="torch", device=args.device, weights=args.weights, max_context=args.max_context,
                                 num_threads=args.threads, decode_step=decode_step, compile=compile)
        backends[name] = TorchBackend.open(model_path(args.model), settings)
    return backends


def _host_transfers(step, stats, vocab_size: int) -> dict:
    """Device-to-host reads and bytes per decode step, after the prompt's last logits (one read of a
    float32 row). The dynamic step brings every verified row's logits: its bytes are counted from the
    rows it verified (one per step, plus each drafted token)."""
    num_steps = max(stats.num_steps, 1)
    row_bytes = 4 * vocab_size
    if step is None:
        return {"host_reads_per_step": None,
                "host_bytes_per_step": round(row_bytes * (stats.num_steps + stats.num_drafted) / num_steps, 1)}
    return {"host_reads_per_step": round((step.num_host_reads - 1) / num_steps, 3),
            "host_bytes_per_step": round((step.num_host_bytes - row_bytes) / num_steps, 1)}


def run(args) -> dict:
    import torch

    from pocketspec.conversation.chat_template import encode_chat, template_for
    from pocketspec.speculation.engine import SpeculativeEngine
    from pocketspec.settings import SamplingSettings, SpeculationSettings

    backends = _open_backends(args)
    tokenizer = backends["dynamic"].tokenizer
    prompts = [encode_chat(tokenizer, template_for(tokenizer), [{"role": "user", "content": question}])
               for question in _questions(args.num_prompts)]
    runs = []
    for round_index in range(args.rounds):
        for prompt_index, prompt in enumerate(prompts):
            for mode, (drafter, temperature) in MODES.items():
                for name, backend in backends.items():
                    backend.rollback(0)
                    step = backend.static_step
                    if step is not None:
                        step.num_host_reads = step.num_host_bytes = 0
                    engine = SpeculativeEngine(backend, speculation=SpeculationSettings(drafter=drafter),
                                               sampling=SamplingSettings(temperature=temperature, seed=prompt_index))
                    result = engine.generate(prompt, args.max_tokens)
                    stats = result.stats
                    runs.append({"round": round_index, "prompt": prompt_index, "mode": mode, "step": name,
                                 "num_tokens": stats.num_tokens, "num_steps": stats.num_steps,
                                 "num_drafted": stats.num_drafted, "num_accepted": stats.num_accepted,
                                 "decode_tokens_per_second": round(stats.decode_tokens_per_second, 3),
                                 **_host_transfers(step, stats, backend.vocab_size), "tokens": result.tokens})
                print(mode, " ".join(f"{row['step']} {row['decode_tokens_per_second']:.1f}"
                                     for row in runs[-len(backends):]), flush=True)
    summary = {}
    for mode in MODES:
        dynamic_runs = [row for row in runs if row["mode"] == mode and row["step"] == "dynamic"]
        for name in backends:
            mine = [row for row in runs if row["mode"] == mode and row["step"] == name]
            summary[f"{mode} | {name}"] = {
                "median_decode_tokens_per_second": round(statistics.median(r["decode_tokens_per_second"] for r in mine), 2),
                "median_ratio_to_dynamic": round(statistics.median(
                    r["decode_tokens_per_second"] / d["decode_tokens_per_second"] for r, d in zip(mine, dynamic_runs)), 3),
                "host_reads_per_step": _median_or_none(r["host_reads_per_step"] for r in mine),
                "host_bytes_per_step": _median_or_none(r["host_bytes_per_step"] for r in mine),
                "num_runs_equal_to_dynamic": (sum(r["tokens"] == d["tokens"] for r, d in zip(mine, dynamic_runs))
                                              if MODES[mode][1] == 0.0 else None),
                "num_runs": len(mine)}
    for backend in backends.values():
        backend.close()
    for row in runs:
        del row["tokens"]
    return {"device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
            "torch": torch.__version__, "model": args.model, "weights": args.weights, "threads": args.threads,
            "max_tokens": args.max_tokens, "max_context": args.max_context, "rounds": args.rounds,
            "num_prompts": len(prompts), "summary": summary, "runs": runs}


def _median_or_none(values):
    values = list(values)
    return None if None in values else statistics.median(values)


COLUMNS = ["mode", "step", "decode tok/s", "ratio to dynamic", "host reads / step", "host bytes / step",
           "greedy runs = dynamic"]


def _table_rows(results: dict) -> list[list]:
    rows = []
    for key, row in results["summary"].items():
        equal = row["num_runs_equal_to_dynamic"]
        rows.append([*key.split(" | "), f"{row['median_decode_tokens_per_second']:.2f}", row["median_ratio_to_dynamic"],
                     "-" if row["host_reads_per_step"] is None else row["host_reads_per_step"], row["host_bytes_per_step"],
                     "-" if equal is None else f"{equal} / {row['num_runs']}"])
    return rows


def _notes(results: dict) -> list[str]:
    return [f"{results['device']}; torch {results['torch']}; {results['threads']} threads; {results['max_tokens']} new "
            f"tokens; KV cache {results['max_context']} tokens; {results['num_prompts']} Spec-Bench questions x "
            f"{results['rounds']} rounds, steps interleaved per prompt",
            "ratio: median over (round, prompt) of decode tok/s / the dynamic step's",
            "host reads and bytes per step (medians over runs) come after the prompt's last logits. The static "
            "step's are counted at StaticDecodeStep.to_host, its only way back to the host; the dynamic step's bytes "
            "are the verified rows' logits (4 x vocabulary bytes each) that it brings to the host (its reads are "
            "not counted)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="catalog name of the model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--weights", default="fp32")
    parser.add_argument("--compile", action="store_true", help="add the compiled static step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=4, choices=range(1, len(CATEGORIES) + 1))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--name", default="decode_step_bench", help="results file stem under benchmarks/results")
    args = parser.parse_args()
    results = run(args)
    title = f"The static decode step against the dynamic one: {results['model']} ({results['weights']})"
    write_results(RESULTS, args.name, results, title, COLUMNS, _table_rows(results), _notes(results))
    print(markdown_table(COLUMNS, _table_rows(results)))


if __name__ == "__main__":
    main()
