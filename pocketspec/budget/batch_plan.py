"""`--memory-budget` with `--batch` (torch): how many rows the pool holds and how many step together."""

from __future__ import annotations

from dataclasses import replace

from memplanner.batch_rows import BatchWorkload, kv_dtype_for, plan_batch
from memplanner.shapes import shape_from_gguf
from memplanner.sizes import round_up
from memplanner.torch_peak import heap_reserve_bytes
from memplanner.torch_sizes import gguf_layout, resolve_weights_format
from pocketspec.backends.torch_open import self_sparse_window
from pocketspec.budget.memory_plan import MemoryPlan, peak_line, sizes_text
from pocketspec.errors import BudgetError
from pocketspec.loader import ModelChoice
from pocketspec.settings import BatchSettings, ModelSettings, SpeculationSettings


def apply_batch_plan(choice: ModelChoice, budget_bytes: int, target_settings: ModelSettings,
                     speculation: SpeculationSettings, batch: BatchSettings) -> MemoryPlan:
    on_gpu = target_settings.is_on_gpu
    weights = resolve_weights_format(target_settings.weights, on_gpu)
    shape = shape_from_gguf(choice.target_path)
    is_tied, has_qkv_bias = gguf_layout(choice.target_path)
    capacity = round_up(target_settings.max_context, batch.key_block)
    workload = BatchWorkload(max_context=capacity, max_batch=batch.max_batch, num_rows=batch.num_rows,
                             max_gamma=speculation.max_gamma, query_tile=batch.query_tile, key_block=batch.key_block,
                             n_batch=target_settings.n_batch)
    draft_shape = shape_from_gguf(choice.draft_path) if choice.draft_path is not None else None
    draft_layers = speculation.skip_layers_kept(shape.num_layers) if choice.drafter == "self-skip" else 0
    found = plan_batch(shape, workload, budget_bytes=budget_bytes, weights_format=weights,
                       kv_dtype=kv_dtype_for(target_settings.torch_kv_type, weights, on_gpu), is_tied=is_tied,
                       has_qkv_bias=has_qkv_bias, on_gpu=on_gpu, draft_shape=draft_shape,
                       draft_is_tied=draft_shape is not None and gguf_layout(choice.draft_path)[0],
                       draft_layers=draft_layers,
                       draft_window=self_sparse_window(target_settings, speculation)
                       if choice.drafter == "self-sparse" else 0,
                       draft_kv_dtype=kv_dtype_for(speculation.self_draft_kv_type, weights, on_gpu))
    if not found.feasible:
        raise BudgetError(found.reason)
    lines = [peak_line("batch", found.total_bytes, budget_bytes, sizes_text(found.terms), heap_reserve_bytes(on_gpu)),
             *(f"memory plan (batch): {note}" for note in found.notes)]
    return MemoryPlan(choice, target_settings, speculation, budget_bytes, lines,
                      batch=replace(batch, max_batch=found.max_batch, num_rows=found.num_rows),
                      predicted_peak_bytes=found.total_bytes, planner_result=found)
