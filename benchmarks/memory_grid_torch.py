"""The torch backend's memory plan against real runs, on a CPU (peak RSS) or a GPU (three views).

    .venv/bin/python benchmarks/memory_grid_torch.py --device cpu            # SmolLM2, here
    .venv/bin/python benchmarks/memory_grid_torch.py --device cuda:0 --model qwen2.5-coder-1.5b-instruct

Each configuration (weights format x context x KV dtype x drafter) runs `pocketspec generate
--backend torch --json` in a fresh process, with a prompt that fills the context and a
budget equal to the predicted peak plus the reserve the plan keeps free on a CPU (the
least budget it accepts). On a CPU it reads `stats.peak_memory_bytes`, the whole process's
peak RSS (VmHWM). On a GPU it checks each view of the plan (torch_peak.gpu_views) against its
own measurement: allocated against torch.cuda.max_memory_allocated (`peak_memory_bytes`),
reserved against max_memory_reserved (`peak_gpu_reserved_bytes`), and the device total
(reserved plus the CUDA context, what nvidia-smi shows) against the largest drop in the GPU's
free memory (torch.cuda.mem_get_info, polled by this process while the run goes on). Results go
to benchmarks/results/memory_grid_torch_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NEW_TOKENS = 16
POLL_SECONDS = 0.02  # how often a GPU's free memory is read while a run goes on
# (weights, context, KV dtype, drafter[, decode step, temperature]): every format, short to long contexts,
# int8 KV, self-drafts, and a static step that samples on the device (its widest verify's float64
# temporaries, torch_peak.device_sampling_bytes; the static step is a GPU's default and a CPU's choice)
CONFIGS = [("fp32", 8192, "auto", "none"), ("fp32", 512, "auto", "none"), ("bf16", 2048, "auto", "none"),
           ("int8", 2048, "auto", "none"), ("fp32", 2048, "auto", "self-sparse"), ("int4", 4096, "int8", "ngram"),
           ("fp16", 1024, "auto", "none"), ("int8", 8192, "int8", "none"), ("fp32", 4096, "auto", "self-skip"),
           ("fp32", 1024, "auto", "ngram", "static", 0.8)]


def predicted_terms(model: str, device: str, weights: str, context: int, kv: str, drafter: str,
                    decode_step: str = "auto") -> dict[str, int]:
    from pocketspec.budget.torch_plan import torch_peak
    from pocketspec.loader import choose_models
    from pocketspec.session_settings import MODEL, SPECULATION, apply_backend_options, with_verify_width

    choice = choose_models(target=model, draft=drafter, pair=None)
    settings, speculation = apply_backend_options(replace(MODEL, max_context=context), SPECULATION, {
        "backend": "torch", "device": device, "weights": weights, "torch_kv_type": kv, "decode_step": decode_step})
    return torch_peak(choice, with_verify_width(settings, speculation, choice), speculation)  # as the CLI plans


def prompt_text(model: str, num_tokens: int) -> str:
    """Spec-Bench text cut to about num_tokens tokens of this model's tokenizer."""
    from pocketspec.backends.gguf_tokenizer import load_tokenizer
    from pocketspec.models.catalog import model_path

    text = (ROOT / "benchmarks" / "data" / "spec_bench.jsonl").read_text()
    vocab_model, tokenizer = load_tokenizer(model_path(model))
    try:
        tokens = tokenizer.encode(text[:8 * num_tokens], add_bos=False)[:num_tokens]
        return tokenizer.decode(tokens)
    finally:
        vocab_model.close()


def _watch_free_memory(command: list[str], device: str) -> tuple[subprocess.CompletedProcess, int | None]:
    """Run `command`; on a GPU, poll its free memory meanwhile: (the run, the largest drop in bytes)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, cwd=ROOT)
        largest_drop = None
        if not device.startswith("cpu"):
            import torch

            index = torch.device(device.replace("rocm", "cuda")).index or 0
            free_before = torch.cuda.mem_get_info(index)[0]  # this process's own context is in both readings
            least_free = free_before
            while process.poll() is None:
                least_free = min(least_free, torch.cuda.mem_get_info(index)[0])
                time.sleep(POLL_SECONDS)
            largest_drop = free_before - least_free
        process.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read()), largest_drop


def run(model: str, device: str, weights: str, context: int, kv: str, drafter: str, decode_step: str = "auto",
        temperature: float = 0.0) -> dict:
    from memplanner.sizes import format_bytes
    from memplanner.device import is_gpu
    from memplanner.torch_peak import gpu_views, heap_reserve_bytes

    on_gpu = is_gpu(device)
    terms = predicted_terms(model, device, weights, context, kv, drafter, decode_step)
    predicted = sum(terms.values())
    budget = predicted + heap_reserve_bytes(on_gpu=on_gpu)  # the least budget the plan accepts
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as prompt_file:
        # leave room for the new tokens, a verify pass and the chat-free raw prompt's BOS
        prompt_file.write(prompt_text(model, context - NEW_TOKENS - 16))
    command = [sys.executable, "-m", "apps.cli", "generate", "--backend", "torch", "--device", device,
               "--weights", weights, "--torch-kv-type", kv, "--target", model, "--draft", drafter,
               "--prompt-file", prompt_file.name, "--max-tokens", str(NEW_TOKENS), "--max-context", str(context),
               "--memory-budget", str(budget), "--threads", "2", "--decode-step", decode_step,
               "--temperature", str(temperature), "--json"]
    done, free_drop = _watch_free_memory(command, device)
    Path(prompt_file.name).unlink()
    record = {"model": model, "device": device, "weights": weights, "context": context, "kv": kv, "drafter": drafter,
              "decode_step": decode_step, "temperature": temperature, "predicted_peak_bytes": predicted,
              "terms": terms, "budget_bytes": budget}
    if done.returncode != 0:
        return {**record, "error": done.stderr.strip().splitlines()[-1:]}
    stats = json.loads(done.stdout)["stats"]
    measured = free_drop if on_gpu else stats["peak_memory_bytes"]
    print(f"{weights:>5} ctx {context:>5} kv {kv:>4} {drafter:>11} {decode_step} T{temperature}: predicted {format_bytes(predicted)} measured "
          f"{format_bytes(measured)} ({(predicted - measured) / measured:+.1%})", file=sys.stderr)
    record.update(measured_peak_bytes=measured, error_fraction=(predicted - measured) / measured,
                  within_budget=measured <= budget, decode_tokens_per_second=stats["decode_tokens_per_second"])
    if on_gpu:
        views = gpu_views(terms)
        record["views"] = {name: {"predicted": views[name], "measured": value,
                                  "error_fraction": (views[name] - value) / value}
                           for name, value in (("allocated", stats["peak_memory_bytes"]),
                                               ("reserved", stats.get("peak_gpu_reserved_bytes")),
                                               ("device", free_drop)) if value}
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--only", type=int, nargs="+", help="Run only these configuration numbers (0-based).")
    args = parser.parse_args()
    if args.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            sys.exit(f"error: --device {args.device} but torch sees no GPU here; run with --device cpu")
    records = []
    for index, config in enumerate(CONFIGS):
        if not args.only or index in args.only:
            records.append(run(args.model, args.device, *config))
            markdown = write(records, args)  # after each run: a long grid can be stopped and still report
    print(markdown.read_text())


def _step_cell(record: dict) -> str:
    return f"{record.get('decode_step', 'auto')}, {record.get('temperature', 0.0)}"


def write(records: list[dict], args) -> Path:
    from apps.report import write_results
    from memplanner.sizes import format_bytes

    measured = [r for r in records if "error" not in r]

    def view_error(record: dict, name: str) -> str:
        view = record.get("views", {}).get(name)
        return f"{view['error_fraction']:+.1%}" if view else "-"

    rows = [[r["weights"], r["context"], r["kv"], r["drafter"], _step_cell(r), format_bytes(r["predicted_peak_bytes"]),
             format_bytes(r["measured_peak_bytes"]), f"{r['error_fraction']:+.1%}", view_error(r, "allocated"),
             view_error(r, "reserved"), "yes" if r["within_budget"] else "NO",
             round(r["decode_tokens_per_second"], 1)] for r in measured]
    worst = max((abs(r["error_fraction"]) for r in measured), default=float("nan"))
    what = "the whole process's peak RSS (VmHWM)" if args.device == "cpu" else (
        "the largest drop in mem_get_info's free bytes (reserved + CUDA context); allocated and reserved "
        "errors: the plan's allocator views against max_memory_allocated and max_memory_reserved")
    notes = [f"{len(measured)} of {len(records)} configurations ran; worst |predicted - measured| = {worst:.1%}",
             f"runs over budget (budget = predicted peak + the CPU heap reserve, the least the plan accepts): {sum(not r['within_budget'] for r in measured)}",
             f"measured = {what}; {args.model}, {NEW_TOKENS} new tokens after a prompt that fills the context"]
    notes += [f"failed: {r['weights']} {r['context']} {r['kv']} {r['drafter']}: {r['error']}" for r in records
              if "error" in r]
    _, markdown = write_results(ROOT / "benchmarks" / "results", f"memory_grid_torch_{args.device.replace(':', '')}",
                                {"records": records}, f"Torch backend memory plan vs measured ({args.device})",
                                ["weights", "context", "KV", "drafter", "step, T", "predicted", "measured", "error",
                                 "allocated error", "reserved error", "in budget", "decode tok/s"], rows, notes)
    return markdown


if __name__ == "__main__":
    main()
