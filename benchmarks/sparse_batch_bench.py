"""Self-sparse speculation in batches (MagicDec's regime): speedup over plain batched decoding by batch × context,
measured beside what the cost model predicts.

    .venv/bin/python benchmarks/sparse_batch_bench.py [--weights fp32 int8] [--batches 1 4 8 16]
        [--contexts 512 2048 8192] [--max-tokens 64] [--window 256] [--max-gamma 8] [--threads 0]
        [--keys sinks attended] [--device cpu|cuda] [--shape llama-3.1-8b] [--name sparse_batch_bench]

Two processes per weight format. Each loads SmolLM2-135M (or, with --shape, a random-weight model of that
shape read with SmolLM2's tokenizer), a pool of max(--batches) rows over max(--contexts) + --max-tokens
positions with the kernels `generate --batch` uses on that device, and a self-sparse draft over --window
positions a row (sinks + recent tokens; with --keys attended, also the keys each row's target attended to
most + recent tokens, pocketspec/drafters/attended_window.py). The first times the pool's forwards (pocketspec/batch/
step_calibration.py) for the cost model, as `doctor --calibrate --batch` does; the second, whose peak
memory is decoding's alone, takes those costs and for each context (prompts of exactly that
many tokens: the largest modules of Python's standard library, cut, with a question after them) and
each batch size B decodes the first B prompts plainly and with each --keys window, --max-tokens
tokens each (end-of-generation ignored, so every run decodes as many). A row's prompt is prefilled once;
later runs reuse it (BatchedModel.reusable_prefix), and prefill seconds are left out of the rates.

Per point: plain and self-sparse decode tok/s, their ratio, the draft's acceptance, tokens per row-step,
whether the outputs equal plain decoding, and the speedup the cost model predicts (memplanner/
batch_step_costs.py) at the measured acceptance and at the planner's prior. Per process: its peak memory
against the batch plan's prediction for its pool. Results: benchmarks/results/<name>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from worker_process import answer_if_worker, run_worker  # noqa: E402

MODEL = "smollm2-135m-instruct"
QUESTION = "\n\nQuestion: what does the code above do, function by function?\nAnswer:"


def long_prompts(tokenizer, num_prompts: int, num_tokens: int) -> list[list[int]]:
    """num_prompts prompts of exactly num_tokens tokens: the largest standard-library modules, each cut to
    leave room for QUESTION after it."""
    modules = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda path: -path.stat().st_size)
    question = tokenizer.encode(QUESTION, add_bos=False)
    prompts = []
    for path in modules[:num_prompts]:
        text = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))  # with the BOS
        if len(text) < num_tokens:
            raise SystemExit(f"{path} has {len(text)} tokens, fewer than the {num_tokens} of a prompt")
        prompts.append(text[:num_tokens - len(question)] + question)
    return prompts


def worker(config: dict) -> dict:
    import numpy as np
    import torch

    from dataclasses import replace

    from memplanner.batch_rows import BatchWorkload, plan_batch
    from memplanner.batch_step_costs import StepCosts, predicted_speedup
    from memplanner.defaults import ACCEPTANCE_PRIORS
    from memplanner.shapes import shape_from_gguf
    from memplanner.sizes import round_up
    from pocketspec.backends.gguf_tokenizer import load_tokenizer
    from pocketspec.backends.torch_backend import resolve_kv_dtype
    from pocketspec.batch.batched_model import BatchedModel
    from pocketspec.batch.drafting import BatchModelDrafter
    from pocketspec.batch.engine import BatchEngine
    from pocketspec.batch.sequence import Request
    from pocketspec.batch.step_calibration import measure_step_costs
    from pocketspec.models.catalog import model_path
    from pocketspec.settings import BatchSettings, SpeculationSettings
    from pocketspec.stats import peak_rss_bytes
    from pocketspec.torch_model.device import resolve_device
    from pocketspec.torch_model.invariant import TileShape, make_batch_invariant
    from pocketspec.torch_model.load import load_model

    device = resolve_device(config["device"])
    if config["threads"]:
        torch.set_num_threads(config["threads"])
    weights = config["weights"]
    if config["shape"] is None:
        model = load_model(model_path(MODEL), weights, device)
        shape, is_tied = shape_from_gguf(model_path(MODEL)), True
    else:
        from torch_gpu_roofline import SHAPES, random_model, shape_of

        model_config = replace(SHAPES[config["shape"]], vocab_size=49152)  # SmolLM2's tokenizer reads the prompts
        model = random_model(model_config, weights, device)
        shape, is_tied = shape_of(config["shape"], model_config), model_config.is_tied
    vocab_model, tokenizer = load_tokenizer(model_path(MODEL))
    batch = BatchSettings(max_batch=max(config["batches"]))
    is_invariant = batch.batch_invariance_on(device.type)
    tiles = TileShape(batch.row_tile) if is_invariant else None
    if tiles is not None:
        make_batch_invariant(model, tiles)
    kv_dtype = resolve_kv_dtype("auto", model)  # the weights' compute dtype
    max_context = max(config["contexts"]) + config["max_tokens"] + 8
    rows = dict(num_rows=batch.max_batch, kv_dtype=kv_dtype, max_logits_rows=config["max_gamma"] + 1)
    target = BatchedModel(model, max_context=max_context, n_batch=512, tiles=tiles,
                          settings=replace(batch, is_batch_invariant=is_invariant), **rows)
    draft = BatchedModel(model, max_context=config["window"], n_batch=min(512, config["window"]), tiles=tiles,
                         settings=replace(batch, is_batch_invariant=False), **rows)
    if config["costs"] is None:  # this process only times the pool's forwards: its heap is not the decoding's
        started = time.perf_counter()
        target_costs, _ = measure_step_costs(target, "target", max_rows=batch.max_batch)
        draft_costs, _ = measure_step_costs(draft, "draft", max_rows=batch.max_batch)
        return {"target_costs": target_costs.to_json(), "draft_costs": draft_costs.to_json(),
                "calibration_seconds": time.perf_counter() - started}
    target_costs = StepCosts.from_json(config["costs"]["target_costs"])
    draft_costs = StepCosts.from_json(config["costs"]["draft_costs"]).with_window(config["window"])

    def never_ends(token: int) -> bool:
        return False

    def run(prompts, keys: str | None) -> tuple[list[list[int]], dict]:
        """keys: what the self-sparse window keeps besides recent tokens (None: plain decoding)."""
        drafts = keys is not None
        speculation = SpeculationSettings(drafter="model" if drafts else "none", max_gamma=config["max_gamma"])
        drafter = BatchModelDrafter(draft, attended_source=target if keys == "attended" else None) if drafts else None
        engine = BatchEngine(target, is_end=never_ends, draft=drafter,
                             speculation=speculation, batch=replace(batch, max_batch=len(prompts)),
                             target_costs=target_costs, draft_costs=draft_costs if drafts else None)
        began = time.perf_counter()
        results = engine.run([Request(prompt, config["max_tokens"]) for prompt in prompts])
        seconds = time.perf_counter() - began - engine.seconds["prefill"]
        num_tokens = sum(len(result.tokens) for result in results)
        stats = {"tokens_per_second": num_tokens / seconds, "num_tokens": num_tokens,
                 "num_drafted": sum(result.stats.num_drafted for result in results),
                 "num_accepted": sum(result.stats.num_accepted for result in results),
                 "tokens_per_row_step": num_tokens / max(1, sum(engine.rows_per_step)),
                 "prefill_seconds": engine.seconds["prefill"]}
        return [result.tokens for result in results], stats

    points = []
    for context in sorted(config["contexts"]):
        prompts = long_prompts(tokenizer, batch.max_batch, context)
        for num_rows, keys in ((num_rows, keys) for num_rows in sorted(config["batches"]) for keys in config["keys"]):
            if keys == config["keys"][0]:
                plain_tokens, plain = run(prompts[:num_rows], None)
            sparse_tokens, sparse = run(prompts[:num_rows], keys)
            alpha = sparse["num_accepted"] / max(1, sparse["num_drafted"])
            point = {"weights": weights, "context": context, "batch": num_rows, "keys": keys,
                     "plain_tokens_per_second": plain["tokens_per_second"],
                     "sparse_tokens_per_second": sparse["tokens_per_second"],
                     "speedup": sparse["tokens_per_second"] / plain["tokens_per_second"],
                     "acceptance": alpha, "tokens_per_row_step": sparse["tokens_per_row_step"],
                     "num_drafted": sparse["num_drafted"],
                     "equals_plain": float(np.mean([a == b for a, b in zip(sparse_tokens, plain_tokens)])),
                     "predicted_at_measured_acceptance": predicted_speedup(
                         target_costs, draft_costs, num_rows=num_rows, context=context, alpha=alpha,
                         max_gamma=config["max_gamma"]).speedup,
                     "predicted_at_prior": predicted_speedup(
                         target_costs, draft_costs, num_rows=num_rows, context=context,
                         alpha=ACCEPTANCE_PRIORS["model"], max_gamma=config["max_gamma"]).speedup,
                     "prefill_seconds": plain["prefill_seconds"] + sparse["prefill_seconds"]}
            points.append(point)
            print(" | ".join(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                             for key, value in point.items()), file=sys.stderr, flush=True)
    vocab_model.close()
    workload = BatchWorkload(max_context=round_up(max_context, batch.key_block), max_batch=batch.max_batch,
                             max_gamma=config["max_gamma"], query_tile=batch.query_tile, key_block=batch.key_block)
    planned = plan_batch(shape, workload, budget_bytes=1 << 50, weights_format=weights, kv_dtype=kv_dtype,
                         is_tied=is_tied, on_gpu=device.type != "cpu", draft_window=config["window"])
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()
    return {"points": points, "planned_peak_bytes": planned.total_bytes, "peak_bytes": peak,
            "peak_kind": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "peak RSS",
            "calibration_seconds": config["costs"]["calibration_seconds"], "target_costs": target_costs.to_json(),
            "draft_costs": draft_costs.to_json(), "kernels": "invariant" if is_invariant else "fast",
            "threads": torch.get_num_threads()}


COLUMNS = ["weights", "context", "batch", "window keeps", "plain tok/s", "self-sparse tok/s", "speedup",
           "predicted (measured α)", "predicted (α prior)", "acceptance", "tokens/row-step", "= plain"]


def table_row(point: dict) -> list:
    return [point["weights"], point["context"], point["batch"], point.get("keys", "sinks"),
            f"{point['plain_tokens_per_second']:.1f}",
            f"{point['sparse_tokens_per_second']:.1f}", f"{point['speedup']:.2f}×",
            f"{point['predicted_at_measured_acceptance']:.2f}×", f"{point['predicted_at_prior']:.2f}×",
            f"{point['acceptance']:.2f}", f"{point['tokens_per_row_step']:.2f}", f"{100 * point['equals_plain']:.0f} %"]


def plot(path: Path, formats: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(formats), figsize=(6 * len(formats), 4.5), squeeze=False)
    for axis, (weights, result) in zip(axes[0], formats.items()):
        batches = sorted({point["batch"] for point in result["points"]})
        for index, num_rows in enumerate(batches):
            points = sorted((point for point in result["points"]
                             if point["batch"] == num_rows and point.get("keys", "sinks") == "sinks"),
                            key=lambda point: point["context"])
            contexts = [point["context"] for point in points]
            color = f"C{index}"
            axis.plot(contexts, [point["speedup"] for point in points], "o-", color=color, label=f"batch {num_rows}")
            axis.plot(contexts, [point["predicted_at_measured_acceptance"] for point in points], "x--", color=color,
                      label=f"batch {num_rows} predicted")
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("context (tokens a row)")
        axis.set_ylabel("self-sparse ÷ plain decode tok/s")
        axis.set_title(f"{weights} weights")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    answer_if_worker(worker)
    from apps.report import write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="+", default=["fp32", "int8"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--window", type=int, default=256, help="self-sparse positions a row (4 sinks + recent)")
    parser.add_argument("--max-gamma", type=int, default=8)
    parser.add_argument("--keys", nargs="+", choices=["sinks", "attended"], default=["sinks"],
                        help="what the self-sparse window keeps besides recent tokens; each is run after one plain run "
                             "(the plot shows sinks)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default=None, help="a random-weight model of this shape instead of SmolLM2")
    parser.add_argument("--name", default="sparse_batch_bench")
    args = parser.parse_args()
    formats = {}
    for weights in args.weights:
        config = {**vars(args), "weights": weights, "costs": None}
        del config["name"]
        # two processes: the peak of the second is decoding's alone, as after `doctor --calibrate --batch`
        config["costs"] = run_worker(__file__, config, what=f"the {weights} calibration", capture_stderr=False)
        formats[weights] = run_worker(__file__, config, what=f"the {weights} worker", capture_stderr=False)
    points = [point for result in formats.values() for point in result["points"]]
    model = f"{args.shape} (random weights)" if args.shape else "SmolLM2-135M"
    first = next(iter(formats.values()))
    description = (f"{model} on {args.device}, {first['threads']} threads, {first['kernels']} target kernels; "
                   f"{args.max_tokens} new tokens a row, self-sparse window {args.window}, γ adaptive up to "
                   f"{args.max_gamma}")
    out_dir = ROOT / "benchmarks" / "results"
    memory = [f"{weights}: peak {result['peak_bytes'] / 2 ** 30:.2f} GiB ({result['peak_kind']}) against a planned "
              f"{result['planned_peak_bytes'] / 2 ** 30:.2f} GiB for the pool of {max(args.batches)} rows"
              for weights, result in formats.items()]
    write_results(out_dir, args.name, {"config": {**vars(args), "cpu_count": os.cpu_count()},
                                       "description": description, "points": points,
                                       "formats": {weights: {key: value for key, value in result.items()
                                                             if key != "points"}
                                                   for weights, result in formats.items()}},
                  f"Self-sparse speculation in batches: {description}", COLUMNS, [table_row(p) for p in points],
                  notes=["decode tok/s: every row's tokens over the run's wall time less its prefills",
                         "tokens/row-step: the rows' tokens (each row's first, from its prefill, included) over the "
                         "steps each row ran in",
                         "predicted: memplanner/batch_step_costs.py on the pool's timed forwards, at the run's "
                         "acceptance (accepted ÷ drafted) and at the planner's prior", *memory])
    plot(out_dir / f"{args.name}.png", formats)
    print(f"wrote {out_dir / args.name}.{{json,md,png}}")


if __name__ == "__main__":
    main()
