"""pocketspec.backends.llama_cpp_backend on real models: how the weights are loaded, and which KV type
each context gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from memplanner import terms
from memplanner.shapes import shape_from_gguf
from pocketspec.backends.llama_cpp_backend import LlamaCppBackend
from pocketspec.loader import ModelChoice, load_engine
from pocketspec.settings import draft_settings_for
from pocketspec.settings import ModelSettings, SpeculationSettings

MIB = 2**20


def is_mapped(path: Path) -> bool:
    return str(path.resolve()) in Path("/proc/self/maps").read_text()  # the kernel names the file, not a link to it


@pytest.mark.parametrize("repack_weights, expect_mapped", [(True, False), (False, True)])
def test_repacked_weights_are_read_without_mmap(qwen_draft_path, repack_weights, expect_mapped):
    """With repacking, a mapped GGUF would keep its repacked tensors' pages resident beside the copy."""
    with LlamaCppBackend(qwen_draft_path, ModelSettings(max_context=256, repack_weights=repack_weights)) as backend:
        assert is_mapped(qwen_draft_path) == expect_mapped
        assert backend.memory_report()["weights"] == shape_from_gguf(qwen_draft_path).weight_bytes


def test_a_model_with_nothing_to_repack_stays_mapped(smollm2_path):
    with LlamaCppBackend(smollm2_path, ModelSettings(max_context=256)):
        assert is_mapped(smollm2_path)


def test_the_draft_kv_type_reaches_the_draft_context(smollm2_path):
    """The same SmolLM2 as target and draft: the draft's context gets q8_0 KV, the target keeps f16 (a fixed γ:
    no cost table is measured for a test of sizes)."""
    target_settings = ModelSettings(max_context=512)
    engine = load_engine(ModelChoice(smollm2_path, smollm2_path, "auto"), target_settings=target_settings,
                         draft_settings=draft_settings_for(target_settings, 512, draft_kv_type="q8_0"),
                         speculation=SpeculationSettings(drafter="model", gamma=3, draft_kv_type="q8_0"))
    try:
        shape = shape_from_gguf(smollm2_path)
        target_kv, draft_kv = (sum(size for name, size in backend.memory_report().items() if "KV" in name)
                               for backend in (engine.target, engine.model.backend))
    finally:
        engine.close()
    # llama.cpp logs the sizes in MiB with two decimals
    assert abs(target_kv - terms.kv_cache_bytes(shape, 512, "f16")) < 0.01 * MIB
    assert abs(draft_kv - terms.kv_cache_bytes(shape, 512, "q8_0")) < 0.01 * MIB


@pytest.mark.parametrize("num_tokens", [1, 40, 64, 65])
def test_a_prompt_is_prefilled_in_its_chunks_with_the_last_token_among_them(smollm2_path, num_tokens):
    """No forward of its own for the prompt's last token: one llama_decode per n_batch chunk, the last one
    returning that token's logits, which are the logits of the same chunks decoded by hand."""
    prompt = [(1000 + 7 * index) % 4000 for index in range(num_tokens)]
    with LlamaCppBackend(smollm2_path, ModelSettings(max_context=256, n_batch=32, n_ubatch=32)) as backend:
        widths = []
        forward = backend.forward
        backend.forward = lambda tokens, rows: widths.append(len(tokens)) or forward(tokens, rows)
        logits = backend.prefill(prompt).copy()
        assert widths == [32] * ((num_tokens - 1) // 32) + [num_tokens - (num_tokens - 1) // 32 * 32]
        assert backend.num_cached == num_tokens
        backend.rollback(0)
        for start in range(0, num_tokens, 32):
            chunk = prompt[start:start + 32]
            expected = forward(chunk, [len(chunk) - 1])[0]
        assert (logits == expected).all()
