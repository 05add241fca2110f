"""memplanner.terms and memplanner.shapes: every term on small hand-computed shapes, and the
shapes read from real GGUF headers and Hugging Face configs."""

import json
from pathlib import Path

import pytest

from conftest import SESSION_HOME

from memplanner import constants, terms
from memplanner.shapes import ModelShape, hf_parameter_count, shape_from_gguf, shape_from_hf_config

MODELS = SESSION_HOME / "models"  # where `make test` pulled them
OBSERVATIONS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "memory_calibration.json"
MIB = 2**20

# 2 layers, 2 KV heads of 32 -> 64 K elements per token and layer
TINY = ModelShape(name="tiny", arch="llama", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
                  head_dim=32, vocab_size=1000, weight_bytes=10_000, file_bytes=12_000,
                  context_length_trained=2048, intermediate_size=256, repacked_bytes=3_000)


def test_context_is_padded_to_256():
    assert [terms.padded_context(n) for n in (1, 256, 257, 300, 4096, 4105)] == [256, 256, 512, 512, 4096, 4352]


@pytest.mark.parametrize("kv_type, per_row", [("f16", 64 * 2), ("q8_0", 2 * 34), ("q4_0", 2 * 18)])
def test_kv_cache_bytes(kv_type, per_row):
    # layers x padded cells x (K row + V row); 100 tokens pad to 256 cells
    assert terms.kv_cache_bytes(TINY, 100, kv_type) == 2 * 256 * 2 * per_row
    assert terms.kv_cache_bytes(TINY, 100, kv_type, num_seqs=3) == 3 * 2 * 256 * 2 * per_row


def test_kv_cache_mixed_types_and_unknown_type():
    assert terms.kv_cache_bytes(TINY, 256, "q8_0", "f16") == 2 * 256 * (68 + 128)
    with pytest.raises(ValueError, match="q5_9"):
        terms.kv_cache_bytes(TINY, 256, "q5_9")


def test_weight_terms():
    assert terms.resident_weights_bytes(TINY) == 12_000  # mmapped: the whole file
    assert terms.resident_weights_bytes(TINY, "cuda", repack_weights=True) == 10_000
    # read without mmap where weights are repacked: only the tensors left out of the repack buffer
    assert terms.resident_weights_bytes(TINY, "cpu", repack_weights=True) == 10_000 - 3_000
    assert terms.loads_without_mmap(TINY, "cpu", True)
    assert not terms.loads_without_mmap(TINY, "cpu", False) and not terms.loads_without_mmap(TINY, "cuda", True)
    assert terms.repacked_weights_bytes(TINY) == 3_000
    assert terms.repacked_weights_bytes(TINY, "cuda") == 0
    expected = constants.MODEL_METADATA_BYTES_PER_VOCAB * 1000 + constants.MODEL_METADATA_BASE_BYTES
    assert terms.model_metadata_bytes(TINY) == expected


def test_logits_and_probability_buffers():
    assert terms.output_buffer_bytes(TINY, 9) == 9 * 1000 * 4
    assert terms.output_buffer_bytes(TINY, 0) == 1000 * 4  # llama.cpp keeps at least one row
    assert terms.logits_all_bytes(TINY, 4096) == 4096 * 1000 * 4
    assert terms.target_probs_bytes(TINY, 8, 0.7) == 9 * 1000 * 8
    assert terms.target_probs_bytes(TINY, 0, 0.7) == 0


def test_compute_buffer_by_hand():
    ubatch, outputs = 64, 5
    output_peak = 4 * (outputs * 1000 + constants.COMPUTE_OUTPUT_HIDDEN * ubatch * 128)
    ffn_peak = 4 * ubatch * (constants.COMPUTE_FFN * 256 + constants.COMPUTE_FFN_HIDDEN * 128) + 2 * ubatch * 512
    expected = int(max(output_peak, ffn_peak)) + constants.COMPUTE_CONST_BYTES[True]
    assert terms.compute_buffer_bytes(TINY, ubatch, 500, outputs) == expected
    # n_ubatch is clamped to n_ctx, outputs to n_ubatch
    assert terms.compute_buffer_bytes(TINY, 512, 64, 512) == terms.compute_buffer_bytes(TINY, 64, 64, 64)
    # without flash attention the f32 KQ scores of every head over the context can dominate
    assert terms.compute_buffer_bytes(TINY, 512, 4096, 1, flash_attn=False) > terms.compute_buffer_bytes(
        TINY, 512, 4096, 1)


def test_small_terms():
    assert terms.runtime_overhead_bytes("cpu") == constants.RUNTIME_OVERHEAD_BYTES["cpu"]
    assert terms.ngram_index_bytes(1000) == 1000 * terms.NGRAM_INDEX_BYTES_PER_TOKEN
    assert terms.working_set_bytes(1000) == terms.GENERATION_WORKING_SET_BYTES + 1000 * terms.CONTEXT_BYTES_PER_TOKEN
    assert terms.draft_context_tokens(1019, 4) == 1024


QWEN15_CONFIG = {"model_type": "qwen2", "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
                 "intermediate_size": 8960, "vocab_size": 151936, "num_hidden_layers": 28,
                 "tie_word_embeddings": True, "max_position_embeddings": 32768}


def test_hf_parameter_count_matches_published_counts():
    assert hf_parameter_count(QWEN15_CONFIG) == 1_543_714_304  # Qwen2.5-1.5B
    smollm2 = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
               "intermediate_size": 1536, "vocab_size": 49152, "num_hidden_layers": 30, "tie_word_embeddings": True}
    assert hf_parameter_count(smollm2) == 134_515_008  # SmolLM2-135M


def test_shape_from_hf_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN15_CONFIG))
    shape = shape_from_hf_config(tmp_path, dtype="bf16")
    assert (shape.num_layers, shape.head_dim, shape.num_kv_heads) == (28, 128, 2)
    assert shape.weight_bytes == 2 * 1_543_714_304 == shape.file_bytes
    assert shape_from_hf_config(QWEN15_CONFIG, dtype="f32").weight_bytes == 4 * 1_543_714_304


@pytest.mark.usefixtures("smollm2_path")  # which fails, saying how to pull it, where it is absent
def test_shape_from_gguf_smollm2_matches_models_md():
    shape = shape_from_gguf(MODELS / "smollm2-135m-instruct.gguf")
    assert (shape.arch, shape.num_layers, shape.hidden_size) == ("llama", 30, 576)
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.vocab_size) == (9, 3, 64, 49152)
    assert shape.file_bytes == 98_362_432
    assert shape.weight_bytes == 96_576_768  # sum of GGUFReader n_bytes over 272 tensors
    assert shape.repacked_bytes == 0  # Q4_1 and Q8_0 are not repacked


@pytest.mark.skipif(not OBSERVATIONS.exists() or not MODELS.exists(), reason="no calibration observations")
def test_compute_buffer_covers_every_measured_context():
    """The fitted model never under-predicts llama.cpp's logged compute buffer, and is close."""
    observations = json.loads(OBSERVATIONS.read_text())
    checked = 0
    for record in observations["models"]:
        path = MODELS / f"{record['model']}.gguf"
        if "contexts" not in record or not path.exists():
            continue
        shape = shape_from_gguf(path)
        for context in record["contexts"]:
            sizes = context.get("buffers_mib", {})
            if "compute" not in sizes or context["kv_type"] != 1:
                continue
            predicted = terms.compute_buffer_bytes(shape, sizes["n_ubatch"], sizes["n_ctx"],
                                                   sizes["n_outputs_max"], flash_attn=context["flash_attn"] != 0)
            observed = sizes["compute"] * MIB
            assert observed - 0.01 * MIB <= predicted <= observed + 9 * MIB, (record["model"], context)
            assert terms.kv_cache_bytes(shape, sizes["n_ctx"]) == pytest.approx(sizes["KV"] * MIB, abs=0.01 * MIB)
            checked += 1
    assert checked > 100


@pytest.mark.skipif(not OBSERVATIONS.exists() or not MODELS.exists(), reason="no calibration observations")
def test_a_loaded_model_holds_its_weights_once_plus_its_metadata():
    """Calibration loads each model as the runtime does (read without mmap where repacked), and what
    the load adds to RSS is the weight terms plus the fitted metadata."""
    observations = json.loads(OBSERVATIONS.read_text())
    checked = 0
    for record in observations["models"]:
        path = MODELS / f"{record['model']}.gguf"
        if "rss_loaded" not in record or not path.exists():
            continue
        shape = shape_from_gguf(path)
        assert record["use_mmap"] == (not terms.loads_without_mmap(shape, "cpu", True))
        predicted = (terms.resident_weights_bytes(shape, "cpu", True) + terms.repacked_weights_bytes(shape)
                     + terms.model_metadata_bytes(shape))
        observed = record["rss_loaded"]["rss"] - record["rss_runtime"]["rss"]
        assert predicted == pytest.approx(observed, rel=0.02), record["model"]
        assert record["rss_baseline"]["rss"] <= constants.PROCESS_BASE_BYTES
        checked += 1
    assert checked == 3
