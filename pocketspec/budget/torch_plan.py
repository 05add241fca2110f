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
from memplanner.sizes import format_bytes, kept_free_text
from pocketspec.budget.memory_plan import LIGHTEST_CONTEXT, MemoryPlan, lighter_advice, peak_line, sizes_text
from memplanner.torch_peak import heap_reserve_bytes, torch_peak_terms
from memplanner.torch_sizes import (gguf_layout, lighter_torch_settings, resolve_weights_format, torch_memory_terms,
                                    torch_tensor_sizes)
from memplanner.torch_split import TorchLayout
from pocketspec.errors import BudgetError, UserError
from pocketspec.loader import ModelChoice
from pocketspec.settings import DRAFTLESS, SELF_DRAFTS, ModelSettings, SpeculationSettings

N_BATCH_CHOICES = (512, 256, 128, 64)


def torch_layout(choice: ModelChoice, target_settings: ModelSettings,
                 speculation: SpeculationSettings) -> tuple[ModelShape, TorchLayout]:
    """The target's shape and what the torch backend will allocate for it; refuses a draft model."""
    if choice.drafter not in (*SELF_DRAFTS, *DRAFTLESS):
        raise UserError("--memory-budget with --backend torch plans self-drafts, n-grams or plain decoding; "
                        "use --draft self-sparse, self-skip, ngram or none")
    on_gpu = target_settings.is_on_gpu
    weights = resolve_weights_format(target_settings.weights, on_gpu)
    kv_dtype = kv_dtype_for(target_settings.torch_kv_type, weights, on_gpu)
    shape = shape_from_gguf(choice.target_path)
    is_tied, has_qkv_bias = gguf_layout(choice.target_path)
    return shape, TorchLayout(
        weights_format=weights, kv_dtype=kv_dtype, max_context=target_settings.max_context, is_tied=is_tied,
        has_qkv_bias=has_qkv_bias, on_gpu=on_gpu,
        self_draft=choice.drafter if choice.drafter.startswith("self-") else None,
        draft_kv_dtype=kv_dtype_for(speculation.self_draft_kv_type, weights, on_gpu),
        draft_window=speculation.self_draft_window,
        draft_layers=speculation.skip_layers_kept(shape.num_layers),
        n_batch=target_settings.n_batch, max_logits_rows=target_settings.max_logits_rows)


def torch_peak(choice: ModelChoice, target_settings: ModelSettings, speculation: SpeculationSettings) -> dict[str, int]:
    """Every term of the torch backend's predicted peak for these settings (CPU: RSS; GPU: the device's
    memory, allocator and CUDA context: torch_peak.gpu_views)."""
    shape, layout = torch_layout(choice, target_settings, speculation)
    tensors = torch_memory_terms(
        shape, weights_format=layout.weights_format, kv_dtype=layout.kv_dtype, max_context=layout.max_context,
        is_tied=layout.is_tied, has_qkv_bias=layout.has_qkv_bias, on_gpu=layout.on_gpu, self_draft=layout.self_draft,
        draft_kv_dtype=layout.draft_kv_dtype, draft_window=layout.draft_window, draft_layers=layout.draft_layers)
    kv_dtypes = (layout.kv_dtype, layout.draft_kv_dtype if layout.self_draft else layout.kv_dtype)
    sizes = torch_tensor_sizes(shape, tensors, weights_format=layout.weights_format, is_tied=layout.is_tied,
                               has_qkv_bias=layout.has_qkv_bias, on_gpu=layout.on_gpu)
    return torch_peak_terms(shape, tensors, weights_format=layout.weights_format, max_context=layout.max_context,
                            n_batch=target_settings.n_batch, max_logits_rows=target_settings.max_logits_rows,
                            kv_is_int8="int8" in kv_dtypes, on_gpu=layout.on_gpu, is_tied=layout.is_tied,
                            tensor_sizes=sizes, static_steps=static_steps(layout, target_settings))


def static_steps(layout: TorchLayout, target_settings: ModelSettings) -> list[tuple[int, int]]:
    """(widest width, context) of each static step the backend opens: the target's, and a self-draft's
    (one row a step: draft_settings_for), over its window or the whole context."""
    if not target_settings.uses_static_step:
        return []
    steps = [(target_settings.max_logits_rows, layout.max_context)]
    if layout.self_draft == "self-sparse":
        steps.append((1, min(layout.draft_window, layout.max_context)))
    elif layout.self_draft == "self-skip":
        steps.append((1, layout.max_context))
    return steps


def torch_reserve_bytes(target_settings: ModelSettings) -> int:
    return heap_reserve_bytes(target_settings.is_on_gpu)


def apply_torch_plan(choice: ModelChoice, budget_bytes: int, target_settings: ModelSettings,
                     speculation: SpeculationSettings) -> MemoryPlan:
    """The settings sized to the budget (smaller prompt chunks first) and the lines that show them;
    UserError when nothing fits."""
    reserve = torch_reserve_bytes(target_settings)
    for n_batch in [target_settings.n_batch] + [n for n in N_BATCH_CHOICES if n < target_settings.n_batch]:
        sized = replace(target_settings, n_batch=n_batch, n_ubatch=min(n_batch, target_settings.n_ubatch))
        peak_terms = torch_peak(choice, sized, speculation)
        total = sum(peak_terms.values())
        if total + reserve <= budget_bytes:
            lines = [peak_line("torch", total, budget_bytes, sizes_text(peak_terms), reserve)]
            if n_batch != target_settings.n_batch:
                lines.append(f"memory plan (torch): prompt chunks n_batch {target_settings.n_batch} -> {n_batch}: "
                             "smaller activations, slower prompt processing")
            return MemoryPlan(choice, sized, speculation, budget_bytes, lines, predicted_peak_bytes=total)
    lightest = replace(target_settings, weights="int4", torch_kv_type="int8", n_batch=N_BATCH_CHOICES[-1],
                       n_ubatch=N_BATCH_CHOICES[-1], max_context=min(target_settings.max_context, LIGHTEST_CONTEXT))
    lightest_flags = f"--weights int4 --torch-kv-type int8 --max-context {lightest.max_context}"
    lightest_speculation = speculation
    if choice.drafter == "self-sparse":  # its window's KV too
        lightest_speculation = replace(speculation, self_draft_kv_type="int8")
        lightest_flags += " --self-draft-kv-type int8"
    advice = lighter_torch_settings(resolve_weights_format(target_settings.weights, target_settings.is_on_gpu),
                                    target_settings.torch_kv_type)
    raise BudgetError(f"--memory-budget {format_bytes(budget_bytes)} is below the torch backend's predicted peak "
                      f"{format_bytes(total)}{kept_free_text(reserve)} ({sizes_text(peak_terms)}); "
                      + lighter_advice(advice, lightest_flags,
                                     sum(torch_peak(choice, lightest, lightest_speculation).values()) + reserve,
                                     budget_bytes))
