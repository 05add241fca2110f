"""One group of the GPU suite (benchmarks/gpu_suite.py): a model and weight format under each decode step.

Runs in a process of its own, started by the suite, and prints one `RESULT {json}` line per
decode step: decode tok/s against the roofline, the seconds to open, and where the group asks
for them the verify curve and the greedy equality and verdict checks.
"""

from __future__ import annotations

import json
import time

VERIFY_WIDTHS = (1, 2, 4, 8, 16, 32)
SAMPLED_WIDTHS = (1, 16, 32)  # a sampled verify against a greedy one (temperature 0.8, top-p 0.95)
# decode steps that swap the model's linears for a library's (pocketspec/torch_model/library_linears.py)
LIBRARY_VARIANTS = {"compiled-torchao": "use_torchao_int8", "compiled-gemlite": "use_gemlite",
                    "compiled-gemlite-fp8": "use_gemlite_fp8"}


def model_config(name: str):
    """A real model's shape (torch_gpu_roofline.SHAPES), or "tiny": the shape the CPU checks run."""
    import torch_gpu_roofline as roofline
    from pocketspec.torch_model.model import ModelConfig

    if name == "tiny":
        return ModelConfig("llama", 4, 256, 4, 2, 64, 512, 4000, 10000.0, 1e-5, False, True)
    return roofline.SHAPES[name]


def _open_backend(model, config, weights: str, device_name: str, variant: str, max_context: int, max_width: int):
    """The torch backend on `model` for `variant`, and the seconds it took to open (compiling and capturing)."""
    from pocketspec.backends.torch_backend import TorchBackend
    from pocketspec.settings import ModelSettings
    from pocketspec.torch_model.fused_projections import unfuse_projections
    from pocketspec.torch_model import quant_kernels
    from pocketspec.torch_model.quant_kernels import int8_kernel
    from pocketspec.torch_model.quantize import Int8Linear
    from pocketspec.torch_model.static_step import StaticDecodeStep

    unfuse_projections(model)  # the step fuses again from the parts below, with their kernel
    for module in model.modules():  # compiled-dequant: the int8 weight dequantized in the (compiled) matmul
        if isinstance(module, Int8Linear):
            module.kernel = ("dequantize" if variant == "compiled-dequant"
                             else int8_kernel(module.weight.device, module.compute_dtype))
    quant_kernels.MATERIALIZE_REDUCTION_ROWS = variant == "compiled-materialized"
    is_static = variant != "eager"
    settings = ModelSettings(backend="torch", device=device_name, weights=weights, max_context=max_context,
                             max_logits_rows=max_width, decode_step="static" if is_static else "dynamic",
                             compile=variant in ("compiled", "compiled-dequant", "compiled-materialized"))
    started = time.perf_counter()
    backend = TorchBackend(model, settings, tokenizer=None, model_path=None, owns_model=False)
    if variant in ("compiled-step", "reduce-overhead", "compiled-sdpa", "compiled-unfused", *LIBRARY_VARIANTS,
                   "compiled-flex", "compiled-write", "compiled-flex-write", "compiled-step-flex"):
        unfuse_projections(model)
        attention = "sdpa" if variant == "compiled-sdpa" else "flex" if "flex" in variant else None
        backend.static_step = StaticDecodeStep(model, backend.cache, num_layers=backend.num_layers,
                                               max_width=max_width, compile=True,
                                               compile_scope="step" if variant in ("compiled-step", "reduce-overhead",
                                                                                   "compiled-step-flex") else "blocks",
                                               captures=variant != "reduce-overhead", attention=attention,
                                               fuses=variant != "compiled-unfused",
                                               writes_in_projection=variant.endswith("-write"))
        if variant in LIBRARY_VARIANTS:  # for good: the group builds its model again after
            from pocketspec.torch_model import library_linears

            swap = getattr(library_linears, LIBRARY_VARIANTS[variant])
            backend.notes.append(f"{swap(model)} linears swapped by {swap.__name__}")
        backend.static_step.warm_up()
    _synchronize(backend.device)
    return backend, time.perf_counter() - started


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_rate(backend, context: int, num_tokens: int) -> float:
    """Tokens per second choosing greedily, one token a step, after `context` cached tokens."""

    from pocketspec.settings import SamplingSettings
    from pocketspec.speculation.draws import SeededDraws

    greedy, draws = SamplingSettings(temperature=0.0), SeededDraws(0)
    backend.rollback(0)
    backend.prefill([7] * context)
    for _ in range(3):
        backend.choose([7], greedy, draws)
    backend.rollback(context)
    _synchronize(backend.device)
    started = time.perf_counter()
    for _ in range(num_tokens):
        backend.choose([7], greedy, draws)
    _synchronize(backend.device)
    return num_tokens / (time.perf_counter() - started)


def _verify_curve(backend, depths: list[int], repeats: int) -> dict:
    """ms per verify call by depth and width (median), and ms per replay of that width's step alone."""
    import numpy as np
    import torch

    from pocketspec.settings import SamplingSettings
    from pocketspec.speculation.draws import SeededDraws

    greedy, draws = SamplingSettings(temperature=0.0), SeededDraws(0)
    step = backend.static_step
    curve = {"verify_ms": {}, "replay_ms": {}}
    for depth in depths:
        backend.rollback(0)
        if depth:
            backend.prefill([7] * depth)
        for name in curve:
            curve[name][depth] = {}
        for width in VERIFY_WIDTHS:
            calls, replays = [], []
            for _ in range(repeats):
                started = time.perf_counter()
                backend.verify([7] * width, greedy, draws)
                calls.append(time.perf_counter() - started)
                backend.rollback(depth)
                _synchronize(backend.device)
                started = time.perf_counter()
                with torch.inference_mode():
                    step._run(step.bucket(width, depth))
                _synchronize(backend.device)
                replays.append(time.perf_counter() - started)
            curve["verify_ms"][depth][width] = round(1e3 * float(np.median(calls)), 4)
            curve["replay_ms"][depth][width] = round(1e3 * float(np.median(replays)), 4)
    return curve


def _sampled_verify(backend, depth: int, vocab_size: int, repeats: int) -> dict:
    """ms per verify call by width, greedy and sampled (temperature 0.8, top-p 0.95: the device's float64
    distributions, top-p's sort and the race over the vocabulary, outside the graph), after `depth` cached
    tokens; on a GPU also the allocator's peak beyond what was allocated before the call, beside the torch
    plan's term for the sampled verify's temporaries (memplanner.torch_peak.device_sampling_bytes)."""
    import numpy as np
    import torch

    from memplanner.torch_peak import device_sampling_bytes
    from pocketspec.settings import SamplingSettings
    from pocketspec.speculation.draws import SeededDraws

    settings = {"greedy": SamplingSettings(temperature=0.0), "sampled": SamplingSettings(temperature=0.8, top_p=0.95)}
    on_cuda = backend.device.type == "cuda"
    found = {"depth": depth, "ms": {name: {} for name in settings}, "peak_bytes": {name: {} for name in settings},
             "planned_bytes": {width: device_sampling_bytes(vocab_size, width, on_cuda) for width in SAMPLED_WIDTHS}}
    backend.rollback(0)
    if depth:
        backend.prefill([7] * depth)
    for width in SAMPLED_WIDTHS:
        for name, sampling in settings.items():
            calls, peak = [], 0
            for _ in range(repeats + 1):  # the first call warms up (not timed); the peak is the largest of all
                _synchronize(backend.device)
                if on_cuda:
                    torch.cuda.reset_peak_memory_stats(backend.device)
                    before = torch.cuda.memory_allocated(backend.device)
                started = time.perf_counter()
                backend.verify([7] * width, sampling, SeededDraws(1))
                calls.append(time.perf_counter() - started)
                if on_cuda:
                    peak = max(peak, torch.cuda.max_memory_allocated(backend.device) - before)
                backend.rollback(depth)
            found["ms"][name][width] = round(1e3 * float(np.median(calls[1:])), 4)
            found["peak_bytes"][name][width] = peak if on_cuda else None
    return found


def cost_table(row: dict, device: str) -> dict:
    """The verify curve as a MeasuredCosts table (seconds by depth and width) for replay_drafting."""
    seconds = {str(depth): {str(width): ms / 1e3 for width, ms in widths.items()}
               for depth, widths in row["verify"]["verify_ms"].items()}
    return {"key": f"gpu-suite {row['model']} {row['weights']} {row['variant']} {device}",
            "weight_bytes": row["weight_bytes"], "seconds": seconds, "spread": {}}


def _speculative_loop(backend, costs, num_tokens: int) -> dict:
    """Greedy n-gram speculation (γ auto, the controller on `costs`, the verify curve's MeasuredCosts) after a
    prompt that repeats
    itself, timed by the real engine: its step time and the share of it spent outside the forwards
    (drafting, the controller, bookkeeping: the loop's host side), beside plain decoding on the same prompt."""
    from pocketspec.settings import SpeculationSettings
    from pocketspec.speculation.engine import SpeculativeEngine
    from replay_target import ReplayTokenizer  # no token ends a generation: random weights have no tokenizer

    backend.tokenizer = backend.tokenizer or ReplayTokenizer()
    room = backend.max_context - num_tokens - VERIFY_WIDTHS[-1] - 1  # a verify past the last token still fits
    prompt = ([(11 * index) % 97 + 3 for index in range(48)] * 4)[:room]
    found = {}
    for drafter in ("none", "ngram"):
        speculation = SpeculationSettings(drafter=drafter, max_draftless_gamma=VERIFY_WIDTHS[-1] - 1)
        backend.rollback(0)
        engine = SpeculativeEngine(backend, speculation=speculation, target_costs=costs)
        stats = engine.generate(prompt, num_tokens).stats
        step_seconds = stats.decode_seconds / max(stats.num_steps, 1)
        found[drafter] = {"decode_tokens_per_second": round(stats.decode_tokens_per_second, 2),
                          "step_ms": round(1e3 * step_seconds, 4),
                          "loop_ms_per_step": round(1e3 * stats.loop_seconds_per_step, 4),
                          "loop_share": round(stats.loop_seconds_per_step / step_seconds, 4) if step_seconds else 0.0,
                          "acceptance": round(stats.acceptance_rate, 4), "num_steps": stats.num_steps}
    return found


def _greedy_tokens(backend, prompt: list[int], count: int) -> list[int]:

    from pocketspec.settings import SamplingSettings
    from pocketspec.speculation.draws import SeededDraws

    greedy, draws = SamplingSettings(temperature=0.0), SeededDraws(0)
    backend.rollback(0)
    tokens = [backend.choose(prompt, greedy, draws)]
    while len(tokens) < count:
        tokens.append(backend.choose(tokens[-1:], greedy, draws))
    return tokens


def _verdicts_agree(backend, prompt: list[int], expected: list[int], draft_length: int = 4) -> list[int]:
    """Verify drafts of the expected (plain) continuation with one token corrupted in each: every
    verdict must accept exactly the drafts before the corruption and name the plain token there.
    Returns the steps where it did not (empty: verification on this step equals plain decoding)."""

    from pocketspec.settings import SamplingSettings
    from pocketspec.speculation.draws import SeededDraws

    greedy, draws = SamplingSettings(temperature=0.0), SeededDraws(0)
    backend.rollback(0)
    backend.prefill(prompt)
    position, wrong, step = 0, [], 0
    while position + draft_length + 1 < len(expected):
        pending = expected[position]
        draft = list(expected[position + 1:position + 1 + draft_length])
        broken = step % (draft_length + 1)  # == draft_length: nothing corrupted, the bonus token follows
        if broken < draft_length:
            draft[broken] = (draft[broken] + 1) % backend.vocab_size
        verdict = backend.verify([pending, *draft], greedy, draws)
        if (verdict.num_accepted, verdict.next_token) != (broken, expected[position + 1 + broken]):
            wrong.append(step)
        backend.rollback(len(prompt) + position + 1 + verdict.num_accepted)
        position += 1 + verdict.num_accepted
        step += 1
    return wrong


def run_group(group: dict, device_name: str, context: int, num_tokens: int) -> None:
    """Measure one model and weight format under each variant; print one JSON line per result."""
    import torch

    import torch_gpu_roofline as roofline
    from memplanner.measured_costs import MeasuredCosts
    from memplanner.torch_sizes import torch_kv_bytes, torch_weight_bytes
    from pocketspec.torch_model.device import resolve_device

    device = resolve_device(device_name)
    config = model_config(group["model"])

    def fresh_model():  # the same weights every time: a library's swap (LIBRARY_VARIANTS) is for good
        torch.manual_seed(0)
        return roofline.random_model(config, group["weights"], device)

    model = fresh_model()
    shape = roofline.shape_of(group["model"], config)
    weight_bytes = torch_weight_bytes(shape, group["weights"], is_tied=config.is_tied,
                                      has_qkv_bias=config.has_qkv_bias, on_gpu=device.type == "cuda")
    max_width = VERIFY_WIDTHS[-1] if group.get("verify") else 8 if group.get("equality") else 1
    reference = None
    for variant in group["variants"]:
        row = {"model": group["model"], "weights": group["weights"], "variant": variant,
               "cached": bool(group.get("cached"))}
        try:
            backend, open_seconds = _open_backend(model, config, group["weights"], device_name, variant,
                                                  context + num_tokens + 8 + max_width, max_width)
            kv_read_bytes = torch_kv_bytes(shape, backend.kv_dtype, context)
            tokens_per_second = _decode_rate(backend, context, num_tokens)
            ceiling = group["bandwidth"] / (weight_bytes + kv_read_bytes)
            row.update(open_seconds=round(open_seconds, 2), tokens_per_second=round(tokens_per_second, 2),
                       roofline_tokens_per_second=round(ceiling, 2), efficiency=round(tokens_per_second / ceiling, 4),
                       weight_bytes=weight_bytes, kv_read_bytes=kv_read_bytes, notes=backend.notes)
            if group.get("equality"):  # the first variant's greedy tokens are the reference
                prompt = [(13 * index + 7) % 300 + 3 for index in range(40)]
                row["tokens"] = _greedy_tokens(backend, prompt, 96)
                reference = reference or row["tokens"]
                row["first_difference"] = next((index for index, (got, want) in enumerate(zip(row["tokens"], reference))
                                                if got != want), None)
                row["wrong_verdicts"] = _verdicts_agree(backend, prompt, reference)
            if group.get("verify") and backend.static_step is not None:
                row["verify"] = _verify_curve(backend, [0, context], repeats=5 if device.type == "cuda" else 2)
                costs = MeasuredCosts.from_json(cost_table(row, device_name))
                row["speculation"] = _speculative_loop(backend, costs, num_tokens)
                row["sampled_verify"] = _sampled_verify(backend, context, shape.vocab_size,
                                                        repeats=5 if device.type == "cuda" else 2)
            backend.close()
        except Exception as error:  # noqa: BLE001 - the suite reports every variant that failed, and goes on
            row["error"] = f"{type(error).__name__}: {str(error)[:400]}"
        print("RESULT " + json.dumps(row), flush=True)
        if variant in LIBRARY_VARIANTS:
            del model
            backend = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if variant in LIBRARY_VARIANTS:
            model = fresh_model()
