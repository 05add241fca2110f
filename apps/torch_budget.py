"""`--memory-budget` with `--backend torch`: the predicted peak checked against the budget.

The torch backend allocates its weights and static KV caches once, at load, so their
sum is known exactly before loading (memplanner/torch_sizes.py); memplanner/torch_peak.py
adds the torch library, the tokenizer, activations and the loading moment. When the peak does
not fit, the prompt is processed in smaller chunks (n_batch) first; what still does not fit
is refused with the breakdown. On a CPU the budget also keeps a small reserve free beside
the peak (torch_peak.heap_reserve_bytes): the heap's peak varies from run to run.
"""

from __future__ import annotations

from dataclasses import replace

from memplanner.batch_rows import kv_dtype_for
from memplanner.shapes import ModelShape, shape_from_gguf
from memplanner.sizes import format_bytes
from memplanner.torch_peak import heap_reserve_bytes, torch_peak_terms
from memplanner.torch_sizes import gguf_layout, torch_memory_terms
from memplanner.torch_split import TorchLayout
from pocketspec.errors import UserError
from pocketspec.loader import ModelChoice
from pocketspec.settings import ModelSettings, SpeculationSettings

N_BATCH_CHOICES = (512, 256, 128, 64)


def is_on_gpu(target_settings: ModelSettings) -> bool:
    return not target_settings.all_devices[0].startswith("cpu")


def weights_format_for(target_settings: ModelSettings, on_gpu: bool) -> str:
    """What `--weights` loads as, for its bytes: `auto` is fp32 on a CPU and a 2-byte float on a GPU
    (bf16 or fp16 by the GPU, pocketspec/torch_model/device.gpu_float_format: the same bytes)."""
    if target_settings.weights == "auto":
        return "bf16" if on_gpu else "fp32"
    return target_settings.weights


def torch_layout(choice: ModelChoice, target_settings: ModelSettings,
                 speculation: SpeculationSettings) -> tuple[ModelShape, TorchLayout]:
    """The target's shape and what the torch backend will allocate for it; refuses a draft model."""
    if choice.drafter not in ("self-sparse", "self-skip", "ngram", "none"):
        raise UserError("--memory-budget with --backend torch plans self-drafts, n-grams or plain decoding; "
                        "use --draft self-sparse, self-skip, ngram or none")
    on_gpu = is_on_gpu(target_settings)
    weights = weights_format_for(target_settings, on_gpu)
    kv_dtype = kv_dtype_for(target_settings.torch_kv_type, weights, on_gpu)
    shape = shape_from_gguf(choice.target_path)
    is_tied, has_qkv_bias = gguf_layout(choice.target_path)
    return shape, TorchLayout(
        weights_format=weights, kv_dtype=kv_dtype, max_context=target_settings.max_context, is_tied=is_tied,
        has_qkv_bias=has_qkv_bias, on_gpu=on_gpu,
        self_draft=choice.drafter if choice.drafter.startswith("self-") else None,
        draft_kv_dtype=kv_dtype_for(speculation.self_draft_kv_type, weights, on_gpu),
        draft_window=speculation.self_draft_window,
        draft_layers=speculation.skip_layers_kept(shape.num_layers))


def torch_peak(choice: ModelChoice, target_settings: ModelSettings, speculation: SpeculationSettings) -> dict[str, int]:
    """Every term of the torch backend's predicted peak for these settings (CPU: RSS; GPU: allocator)."""
    shape, layout = torch_layout(choice, target_settings, speculation)
    tensors = torch_memory_terms(
        shape, weights_format=layout.weights_format, kv_dtype=layout.kv_dtype, max_context=layout.max_context,
        is_tied=layout.is_tied, has_qkv_bias=layout.has_qkv_bias, on_gpu=layout.on_gpu, self_draft=layout.self_draft,
        draft_kv_dtype=layout.draft_kv_dtype, draft_window=layout.draft_window, draft_layers=layout.draft_layers)
    kv_dtypes = (layout.kv_dtype, layout.draft_kv_dtype if layout.self_draft else layout.kv_dtype)
    return torch_peak_terms(shape, tensors, weights_format=layout.weights_format, max_context=layout.max_context,
                            n_batch=target_settings.n_batch, max_logits_rows=target_settings.max_logits_rows,
                            kv_is_int8="int8" in kv_dtypes, on_gpu=layout.on_gpu, is_tied=layout.is_tied)


def torch_reserve_bytes(target_settings: ModelSettings) -> int:
    return heap_reserve_bytes(is_on_gpu(target_settings))


def check_torch_budget(choice: ModelChoice, budget_bytes: int, target_settings: ModelSettings,
                       speculation: SpeculationSettings) -> tuple[list[str], ModelSettings]:
    """Notes describing the plan and the settings sized to it; UserError when nothing fits."""
    notes = []
    reserve = torch_reserve_bytes(target_settings)
    kept_free = f" + {format_bytes(reserve)} kept free" if reserve else ""
    for n_batch in [target_settings.n_batch] + [n for n in N_BATCH_CHOICES if n < target_settings.n_batch]:
        sized = replace(target_settings, n_batch=n_batch, n_ubatch=min(n_batch, target_settings.n_ubatch))
        peak_terms = torch_peak(choice, sized, speculation)
        total = sum(peak_terms.values())
        parts = ", ".join(f"{name} {format_bytes(size)}" for name, size in peak_terms.items())
        if total + reserve <= budget_bytes:
            if n_batch != target_settings.n_batch:
                notes.append(f"memory plan (torch): prompt chunks n_batch {target_settings.n_batch} -> {n_batch}: "
                             "smaller activations, slower prompt processing")
            notes.insert(0, f"memory plan (torch): predicted peak {format_bytes(total)}{kept_free} of "
                            f"{format_bytes(budget_bytes)} ({parts})")
            return notes, sized
    raise UserError(f"--memory-budget {format_bytes(budget_bytes)} is below the torch backend's predicted peak "
                    f"{format_bytes(total)}{kept_free} ({parts}); try --weights int8 or int4, a smaller --max-context, "
                    "or --torch-kv-type int8")
