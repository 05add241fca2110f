"""Batched decoding: throughput and latency at batch 1 to 16, plain and speculative, and where the time goes.

    .venv/bin/python benchmarks/batch_bench.py [--batches 1 2 4 8 16] [--num-prompts 16] [--max-tokens 64]
        [--modes plain ngram self-skip] [--schedulers pad group] [--kernels invariant fast] [--pool-factor 1]
        [--threads 0]
        [--device cpu|cuda] [--shape smollm2-135m|qwen2.5-1.5b|llama-3.1-8b] [--name batch_bench]

Prompts are the first turns of benchmarks/data/spec_bench.jsonl, taken in turn from each
category, in SmolLM2's chat template. Every configuration decodes the same prompts with
continuous batching (pool rows = batch size × --pool-factor). Per configuration: total tok/s (all tokens
over the wall time, prefills included), decode tok/s (without prefill seconds), mean and
p90 latency per request (submission to last token), acceptance, and the share of the wall
time spent aligning rows (building layouts, the per-row KV scatter/gather, padding and
unpadding queries), in the target's forwards, in drafting and in verification. "= alone"
is the share of sequences whose tokens equal plain batch-1 decoding with the same kernels
(invariant kernels must give 100 %). On a CPU the model is the real SmolLM2 (fp32); with
--shape and a GPU (--device cuda), a random-weight model of that shape in bf16, read with
SmolLM2's tokenizer. Results: benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from apps.prompt_file import read_prompt_rows  # noqa: E402
from apps.report import write_results  # noqa: E402
from pocketspec.backends.gguf_tokenizer import load_tokenizer  # noqa: E402
from pocketspec.backends.torch_backend import resolve_weights_format  # noqa: E402
from pocketspec.batch.batched_model import BatchedModel  # noqa: E402
from pocketspec.batch.drafting import BatchModelDrafter  # noqa: E402
from pocketspec.batch.engine import BatchEngine  # noqa: E402
from pocketspec.batch.sequence import Request  # noqa: E402
from pocketspec.models.catalog import model_path  # noqa: E402
from pocketspec.conversation.chat_template import encode_chat, template_for  # noqa: E402
from pocketspec.settings import BatchSettings, SpeculationSettings  # noqa: E402
from pocketspec.torch_model.device import resolve_device  # noqa: E402
from pocketspec.torch_model.invariant import TileShape, make_batch_invariant  # noqa: E402
from pocketspec.torch_model.load import load_model  # noqa: E402

DATA_PATH = ROOT / "benchmarks" / "data" / "spec_bench.jsonl"
MODEL = "smollm2-135m-instruct"


def spec_bench_prompts(tokenizer, num_prompts: int, max_prompt_tokens: int) -> list[list[int]]:
    """First turns, one category after another, in the chat template; prompts longer than the limit are skipped."""
    by_category: dict[str, list[str]] = {}
    for row in read_prompt_rows(DATA_PATH, "Spec-Bench"):
        by_category.setdefault(row.category, []).append(row.text)
    template = template_for(tokenizer)
    prompts: list[list[int]] = []
    for index in range(max(map(len, by_category.values()))):
        for texts in by_category.values():
            if index < len(texts) and len(prompts) < num_prompts:
                tokens = encode_chat(tokenizer, template, [{"role": "user", "content": texts[index]}])
                if len(tokens) <= max_prompt_tokens:
                    prompts.append(tokens)
    return prompts


def load_target(args, device: torch.device):
    if args.shape is None:
        return load_model(model_path(MODEL), resolve_weights_format("auto", device), device)
    from torch_gpu_roofline import SHAPES, random_model

    config = replace(SHAPES[args.shape], vocab_size=49152)  # SmolLM2's tokenizer reads its prompts
    return random_model(config, resolve_weights_format("auto", device), device)


class Runner:
    """One loaded target (wrapped for batch invariance or not) and engines over it."""

    def __init__(self, args, device: torch.device, tokenizer, is_batch_invariant: bool):
        self.args, self.tokenizer = args, tokenizer
        self.settings = BatchSettings(is_batch_invariant=is_batch_invariant)
        self.model = load_target(args, device)
        self.tiles = TileShape(self.settings.row_tile) if is_batch_invariant else None
        if self.tiles is not None:
            make_batch_invariant(self.model, self.tiles)
        self.kv_dtype = resolve_weights_format("auto", device)  # the KV cache in the weights' own dtype

    def engine(self, mode: str, max_batch: int, scheduler: str, max_context: int) -> BatchEngine:
        rows = dict(num_rows=max_batch * self.args.pool_factor, max_context=max_context, kv_dtype=self.kv_dtype,
                    n_batch=512)
        target = BatchedModel(self.model, settings=self.settings, tiles=self.tiles, **rows)
        draft = None
        if mode == "self-skip":
            draft = BatchedModel(self.model, settings=replace(self.settings, is_batch_invariant=False),
                                 tiles=self.tiles, num_layers=self.args.skip_layers, **rows)
        drafter = {"plain": "none", "self-skip": "model"}.get(mode, mode)
        speculation = SpeculationSettings(drafter=drafter, gamma=self.args.gamma)
        return BatchEngine(target, is_end=self.tokenizer.is_end_of_generation,
                           draft=BatchModelDrafter(draft) if draft is not None else None,
                           speculation=speculation, batch=replace(self.settings, max_batch=max_batch,
                                                                  scheduler=scheduler))


def measure(runner: Runner, mode: str, max_batch: int, scheduler: str, prompts, reference) -> dict:
    max_context = max(map(len, prompts)) + runner.args.max_tokens + 16
    engine = runner.engine(mode, max_batch, scheduler, max_context)
    requests = [Request(prompt, runner.args.max_tokens) for prompt in prompts]
    started = time.perf_counter()
    results = engine.run(requests)
    seconds = time.perf_counter() - started
    num_tokens = sum(len(result.tokens) for result in results)
    latencies = np.array([result.latency_seconds for result in results])
    num_drafted = sum(result.stats.num_drafted for result in results)
    timer = engine.target.timer.seconds
    row = {"kernels": "invariant" if runner.tiles is not None else "fast", "scheduler": scheduler, "mode": mode,
           "batch": max_batch, "pool_rows": engine.target.num_rows, "num_prompts": len(prompts),
           "num_tokens": num_tokens, "seconds": round(seconds, 3),
           "tokens_per_second": round(num_tokens / seconds, 3),
           "decode_tokens_per_second": round(num_tokens / max(seconds - engine.seconds["prefill"], 1e-9), 3),
           "mean_latency_seconds": round(float(latencies.mean()), 3),
           "p90_latency_seconds": round(float(np.percentile(latencies, 90)), 3),
           "num_drafted": num_drafted, "num_accepted": sum(result.stats.num_accepted for result in results),
           "num_steps": engine.num_steps,
           "mean_rows_per_step": round(float(np.mean(engine.rows_per_step)), 2) if engine.rows_per_step else 0.0,
           "alignment_fraction": round(engine.alignment_seconds / seconds, 4),
           "layout_fraction": round(timer["layout"] / seconds, 4),
           "kv_and_padding_fraction": round(timer["kv_and_padding"] / seconds, 4),
           **{f"{part}_fraction": round(value / seconds, 4) for part, value in engine.seconds.items()}}
    if reference is not None:
        row["equals_alone"] = round(float(np.mean([result.tokens == tokens
                                                   for result, tokens in zip(results, reference)])), 4)
    return row, [result.tokens for result in results]


COLUMNS = ["kernels", "scheduler", "mode", "batch", "pool rows", "tok/s", "decode tok/s", "mean latency s",
           "p90 latency s", "accepted/drafted", "rows/step", "alignment %", "target fwd %", "draft %", "verify %", "= alone"]


def table_row(row: dict) -> list:
    return [row["kernels"], row["scheduler"], row["mode"], row["batch"], row["pool_rows"], row["tokens_per_second"],
            row["decode_tokens_per_second"], row["mean_latency_seconds"], row["p90_latency_seconds"],
            f"{row['num_accepted']}/{row['num_drafted']}", row["mean_rows_per_step"], f"{100 * row['alignment_fraction']:.1f}",
            f"{100 * row['target_forward_fraction']:.1f}", f"{100 * row['draft_fraction']:.1f}",
            f"{100 * row['verification_fraction']:.1f}", f"{100 * row.get('equals_alone', float('nan')):.0f} %"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer prompts are skipped")
    parser.add_argument("--modes", nargs="+", default=["plain", "ngram", "self-skip"])
    parser.add_argument("--schedulers", nargs="+", default=["pad", "group"])
    parser.add_argument("--kernels", nargs="+", default=["invariant", "fast"])
    parser.add_argument("--pool-factor", type=int, default=1, help="pool rows = this many times the batch")
    parser.add_argument("--gamma", type=int, default=None, help="fixed γ (default: the adaptive controller)")
    parser.add_argument("--skip-layers", type=int, default=20, help="self-skip: layers the draft keeps")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default=None, help="a random-weight model of this shape instead of SmolLM2")
    parser.add_argument("--name", default="batch_bench")
    args = parser.parse_args()
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    vocab_model, tokenizer = load_tokenizer(model_path(MODEL))
    prompts = spec_bench_prompts(tokenizer, args.num_prompts, args.max_prompt_tokens)
    rows = []
    for kernels in args.kernels:
        runner = Runner(args, device, tokenizer, is_batch_invariant=kernels == "invariant")
        first, alone = measure(runner, "plain", 1, args.schedulers[0], prompts, None)  # the reference
        first["equals_alone"] = 1.0
        for scheduler in args.schedulers:
            for mode in args.modes:
                for max_batch in args.batches:
                    is_first = (scheduler, mode, max_batch) == (args.schedulers[0], "plain", 1)
                    row = first if is_first else measure(runner, mode, max_batch, scheduler, prompts, alone)[0]
                    rows.append(row)
                    print(" | ".join(str(cell) for cell in table_row(row)), flush=True)
        del runner
    vocab_model.close()
    description = (f"{'SmolLM2-135M fp32' if args.shape is None else args.shape + ' (random weights)'} on "
                   f"{device.type}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
                   f"{len(prompts)} Spec-Bench prompts, {args.max_tokens} new tokens each, "
                   f"γ {'adaptive' if args.gamma is None else args.gamma}")
    write_results(ROOT / "benchmarks" / "results", args.name,
                  {"config": {**vars(args), "cpu_count": os.cpu_count()}, "description": description, "rows": rows},
                  f"Batched decoding: {description}", COLUMNS, [table_row(row) for row in rows],
                  notes=["tok/s: all tokens over the wall time, prefills included; decode tok/s leaves prefill "
                         "seconds out", "alignment: building layouts, per-row KV scatter/gather and query padding",
                         "= alone: sequences equal to plain batch-1 decoding with the same kernels"])


if __name__ == "__main__":
    main()
