"""`--memory-budget` with `--backend onnx`: the predicted peak (memplanner/onnx_sizes.py) checked against the budget.

ONNX Runtime's prepacked weights decode faster (SmolLM2: 25 % on a CPU) and are kept while their bound
fits, with prompt chunks (n_batch) halved down to 64 if need be, since decoding outweighs prompt
processing; otherwise the weights are read in place from the mapped file, chunks halved again if need
be. What still does not fit is refused with the breakdown. A draft model, exported the same way, adds its weights and KV cache
at its context; the two models' steps never run at once, so only the larger step's activations count.
On the CPU provider the budget also keeps the torch plans' heap reserve free (torch_peak.heap_reserve_bytes):
ONNX Runtime's freed buffers stay in glibc's heap by amounts that vary from run to run (SmolLM2 int4, read in
place: 553 to 580 MiB peak for one configuration, 486 MiB with glibc trimming every free).
"""

from __future__ import annotations

from dataclasses import replace

from memplanner.onnx_sizes import onnx_peak_terms, resolve_onnx_format
from memplanner.shapes import shape_from_gguf
from memplanner.sizes import format_bytes, kept_free_text
from memplanner.torch_peak import heap_reserve_bytes
from memplanner.torch_sizes import gguf_layout
from pocketspec.budget.memory_plan import LIGHTEST_CONTEXT, MemoryPlan, lighter_advice, peak_line, sizes_text
from pocketspec.errors import BudgetError
from pocketspec.loader import ModelChoice
from pocketspec.settings import ModelSettings, SpeculationSettings

N_BATCH_CHOICES = (512, 256, 128, 64)


def _model_terms(path, settings: ModelSettings, *, max_context: int, max_logits_rows: int) -> dict[str, int]:
    is_tied, has_qkv_bias = gguf_layout(path)
    return onnx_peak_terms(shape_from_gguf(path), max_context=max_context, n_batch=settings.n_batch,
                           weights_format=resolve_onnx_format(settings.weights, settings.execution_provider),
                           max_logits_rows=max_logits_rows, is_tied=is_tied, has_qkv_bias=has_qkv_bias,
                           prepacks=settings.prepack_weights, on_cpu=settings.execution_provider == "cpu")


def onnx_peak(choice: ModelChoice, settings: ModelSettings, speculation: SpeculationSettings) -> dict[str, int]:
    """Every term of the predicted peak RSS for the target and, when one may load, its draft model."""
    terms = _model_terms(choice.target_path, settings, max_context=settings.max_context,
                         max_logits_rows=settings.max_logits_rows)
    if choice.draft_path is not None and speculation.drafter in ("auto", "model"):
        draft = _model_terms(choice.draft_path, settings, max_context=settings.max_context, max_logits_rows=1)
        terms["draft weights"], terms["draft KV cache"] = draft["weights"], draft["KV cache"]
        terms["activations"] = max(terms["activations"], draft["activations"])
    return terms


def apply_onnx_plan(choice: ModelChoice, budget_bytes: int, target_settings: ModelSettings,
                    speculation: SpeculationSettings) -> MemoryPlan:
    """The settings sized to the budget and the lines that show them; UserError when nothing fits."""
    choices = [(prepacks, n_batch) for prepacks in (True, False)
               for n_batch in [target_settings.n_batch] + [n for n in N_BATCH_CHOICES if n < target_settings.n_batch]]
    if not target_settings.prepack_weights:
        choices = [(prepacks, n_batch) for prepacks, n_batch in choices if not prepacks]
    reserve = heap_reserve_bytes(on_gpu=target_settings.execution_provider != "cpu")
    for prepacks, n_batch in choices:
        sized = replace(target_settings, prepack_weights=prepacks, n_batch=n_batch,
                        n_ubatch=min(n_batch, target_settings.n_ubatch))
        terms = onnx_peak(choice, sized, speculation)
        total = sum(terms.values())
        if total + reserve <= budget_bytes:
            lines = [peak_line("onnx", total, budget_bytes, sizes_text(terms), reserve)]
            if not prepacks:
                lines.append("memory plan (onnx): weights read in place from the mapped file, not prepacked: less "
                             "memory, slower decoding on the CPU provider")
            if n_batch != target_settings.n_batch:
                lines.append(f"memory plan (onnx): prompt chunks n_batch {target_settings.n_batch} -> {n_batch}: "
                             "smaller activations, slower prompt processing")
            return MemoryPlan(choice, sized, speculation, budget_bytes, lines, predicted_peak_bytes=total)
    lightest = replace(target_settings, weights="int4", prepack_weights=False, n_batch=N_BATCH_CHOICES[-1],
                       n_ubatch=N_BATCH_CHOICES[-1], max_context=min(target_settings.max_context, LIGHTEST_CONTEXT))
    advice = "try " + ("a smaller --max-context" if target_settings.weights == "int4" else
                       "--weights int4 or a smaller --max-context")
    raise BudgetError(f"--memory-budget {format_bytes(budget_bytes)} is below the ONNX backend's predicted peak "
                      f"{format_bytes(total)}{kept_free_text(reserve)} ({sizes_text(terms)}); "
                      + lighter_advice(advice, f"--weights int4 --max-context {lightest.max_context}",
                                     sum(onnx_peak(choice, lightest, speculation).values()) + reserve, budget_bytes))
