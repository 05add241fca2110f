"""--memory-budget with --backend onnx (pocketspec/budget/onnx_plan.py): prepacked weights while their bound fits,
then weights read in place, then smaller prompt chunks, then a refusal that names the terms; a draft model counts."""

from __future__ import annotations

import pytest

from memplanner.torch_peak import CPU_HEAP_RESERVE_BYTES
from pocketspec.budget.onnx_plan import apply_onnx_plan, onnx_peak
from pocketspec.errors import UserError
from pocketspec.loader import ModelChoice
from pocketspec.settings import ModelSettings, SpeculationSettings

SETTINGS = ModelSettings(backend="onnx", max_context=1024, n_batch=512)  # where prepacking costs more than big chunks
SPECULATION = SpeculationSettings()


def _total(choice, **changes) -> int:
    """The least CPU budget for these settings: the predicted peak and the heap reserve kept free beside it."""
    from dataclasses import replace

    return sum(onnx_peak(choice, replace(SETTINGS, **changes), SPECULATION).values()) + CPU_HEAP_RESERVE_BYTES


def test_the_plan_drops_prepacking_then_shrinks_prompt_chunks_then_refuses(smollm2_path):
    choice = ModelChoice(smollm2_path, None, "ngram")
    packed, unpacked = _total(choice), _total(choice, prepack_weights=False)
    assert _total(choice, n_batch=64) > unpacked  # no smaller prompt chunk makes room for prepacking
    roomy = apply_onnx_plan(choice, packed, SETTINGS, SPECULATION)
    assert roomy.target_settings.prepack_weights and roomy.target_settings.n_batch == 512
    tight = apply_onnx_plan(choice, unpacked, SETTINGS, SPECULATION)
    assert not tight.target_settings.prepack_weights and tight.target_settings.n_batch == 512
    assert any("not prepacked" in line for line in tight.lines)
    tighter = apply_onnx_plan(choice, unpacked - 1, SETTINGS, SPECULATION)
    assert tighter.target_settings.n_batch < 512 and tighter.predicted_peak_bytes + CPU_HEAP_RESERVE_BYTES < unpacked
    assert "kept free" in tighter.lines[0]
    with pytest.raises(UserError, match="below the ONNX backend's predicted peak .*KV cache"):
        apply_onnx_plan(choice, _total(choice, prepack_weights=False, n_batch=64) - 1, SETTINGS, SPECULATION)


def test_a_draft_model_adds_its_weights_and_cache(smollm2_path):
    alone = onnx_peak(ModelChoice(smollm2_path, None, "ngram"), SETTINGS, SPECULATION)
    paired = onnx_peak(ModelChoice(smollm2_path, smollm2_path, "auto"), SETTINGS, SPECULATION)
    assert paired["draft weights"] == alone["weights"] and paired["draft KV cache"] == alone["KV cache"]
    assert paired["activations"] == alone["activations"]  # one model's step at a time


def test_only_the_rows_a_context_can_touch_of_a_lookup_table_are_planned(smollm2_path, qwen_draft_path):
    """An untied model's embedding (or the float one beside an int4 head) is read at the tokens seen; a tied
    float model looks its tokens up in the head, which is resident whole anyway."""
    from memplanner.onnx_sizes import lookup_table_bytes, looked_up_bytes
    from memplanner.shapes import shape_from_gguf

    qwen, smollm2 = shape_from_gguf(qwen_draft_path), shape_from_gguf(smollm2_path)
    table = lookup_table_bytes(qwen, "fp32", is_tied=False)
    assert table == qwen.vocab_size * qwen.hidden_size * 4
    short, long = (looked_up_bytes(qwen, "fp32", is_tied=False, max_context=context) for context in (512, 4096))
    assert 0 < short < long < table / 10
    assert looked_up_bytes(qwen, "fp32", is_tied=False, max_context=10**6) == table
    assert lookup_table_bytes(smollm2, "fp32", is_tied=True) == 0
    assert lookup_table_bytes(smollm2, "int4", is_tied=True) == smollm2.vocab_size * smollm2.hidden_size * 4
