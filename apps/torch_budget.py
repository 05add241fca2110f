"""`--memory-budget` with `--backend torch`: the planner's exact tensor bytes checked against the budget.

The torch backend allocates its weights and static KV caches once, at load, so their
sum is known exactly before loading (memplanner/torch_sizes.py). What the budget cannot
hold is refused with that breakdown; the Python and torch runtime itself is not counted.
"""

from __future__ import annotations

from memplanner.shapes import ModelShape, shape_from_gguf
from memplanner.sizes import format_bytes
from memplanner.torch_sizes import gguf_layout, torch_memory_terms
from memplanner.torch_split import TorchLayout
from pocketspec.errors import UserError
from pocketspec.loader import ModelChoice
from pocketspec.settings import ModelSettings, SpeculationSettings


def _compute_dtype(weights: str, on_gpu: bool) -> str:
    """What `auto` weights and KV dtypes become: a float format itself, else fp32 on a CPU and bf16 on a GPU."""
    if weights in ("fp32", "bf16", "fp16"):
        return weights
    return "bf16" if on_gpu else "fp32"


def _kv_dtype(kv_dtype: str, weights: str, on_gpu: bool) -> str:
    return _compute_dtype(weights, on_gpu) if kv_dtype == "auto" else kv_dtype


def torch_layout(choice: ModelChoice, target_settings: ModelSettings,
                 speculation: SpeculationSettings) -> tuple[ModelShape, TorchLayout]:
    """The target's shape and what the torch backend will allocate for it; refuses a draft model."""
    if choice.drafter not in ("self-sparse", "self-skip", "ngram", "none"):
        raise UserError("--memory-budget with --backend torch plans self-drafts, n-grams or plain decoding; "
                        "use --draft self-sparse, self-skip, ngram or none")
    device = target_settings.devices[0] if target_settings.devices else target_settings.device
    on_gpu = not device.startswith("cpu")
    weights = _compute_dtype(target_settings.weights, on_gpu) if target_settings.weights == "auto" else target_settings.weights
    kv_dtype = _kv_dtype(target_settings.torch_kv_type, weights, on_gpu)
    shape = shape_from_gguf(choice.target_path)
    is_tied, has_qkv_bias = gguf_layout(choice.target_path)
    return shape, TorchLayout(
        weights_format=weights, kv_dtype=kv_dtype, max_context=target_settings.max_context, is_tied=is_tied,
        has_qkv_bias=has_qkv_bias, on_gpu=on_gpu,
        self_draft=choice.drafter if choice.drafter.startswith("self-") else None,
        draft_kv_dtype=_kv_dtype(speculation.self_draft_kv_type, weights, on_gpu),
        draft_window=speculation.self_draft_window,
        draft_layers=speculation.self_skip_layers or max(1, shape.num_layers // 2))


def check_torch_budget(choice: ModelChoice, budget_bytes: int, target_settings: ModelSettings,
                       speculation: SpeculationSettings) -> list[str]:
    """Notes describing the plan; raises UserError when the tensors alone exceed the budget."""
    shape, layout = torch_layout(choice, target_settings, speculation)
    terms = torch_memory_terms(
        shape, weights_format=layout.weights_format, kv_dtype=layout.kv_dtype, max_context=layout.max_context,
        is_tied=layout.is_tied, has_qkv_bias=layout.has_qkv_bias, on_gpu=layout.on_gpu, self_draft=layout.self_draft,
        draft_kv_dtype=layout.draft_kv_dtype, draft_window=layout.draft_window, draft_layers=layout.draft_layers)
    total = sum(terms.values())
    parts = ", ".join(f"{name} {format_bytes(size)}" for name, size in terms.items())
    if total > budget_bytes:
        raise UserError(f"--memory-budget {format_bytes(budget_bytes)} cannot hold the torch backend's tensors "
                        f"({parts}: {format_bytes(total)}); try --weights int8 or int4, a smaller --max-context, "
                        "or --torch-kv-type int8")
    return [f"memory plan (torch): {parts} = {format_bytes(total)} of {format_bytes(budget_bytes)}, "
            "plus the Python/torch runtime"]
