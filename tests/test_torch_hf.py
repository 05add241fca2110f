"""Loading a Hugging Face directory (config.json + safetensors): the torch model computes what
transformers computes for the same tiny random llama and qwen2 checkpoints, and the planner
counts its bytes exactly."""

from __future__ import annotations

import pytest
import torch

from memplanner.shapes import shape_from_hf_config
from memplanner.torch_sizes import torch_weight_bytes
from pocketspec.torch_model.kv_cache import StaticKVCache
from pocketspec.torch_model.load import load_model

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)


def _write_checkpoint(folder, model_type: str):
    torch.manual_seed(0)
    if model_type == "llama":
        config = transformers.LlamaConfig(**TINY, rope_theta=10000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**TINY, rope_theta=1e6, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(config)
        with torch.no_grad():  # transformers initialises biases to zero; make them count
            for layer in model.model.layers:
                for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    projection.bias.normal_(0.0, 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    return model.eval()


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_hf_directory_matches_transformers(tmp_path, model_type):
    reference = _write_checkpoint(tmp_path, model_type)
    tokens = torch.tensor([[1, 5, 17, 42, 99, 250, 7, 7, 3, 120]])
    with torch.no_grad():
        expected = reference(tokens).logits[0]
    model = load_model(tmp_path, "fp32", torch.device("cpu"))
    assert model.config.has_qkv_bias == (model_type == "qwen2") and model.config.is_tied == (model_type == "qwen2")
    cache = StaticKVCache(num_layers=2, num_kv_heads=2, head_dim=16, max_context=32, kv_dtype="fp32",
                          device=torch.device("cpu"))
    with torch.inference_mode():
        ours = model(tokens, 0, cache, torch.arange(10))[0]
    assert torch.allclose(ours, expected, atol=1e-5), float((ours - expected).abs().max())
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    allocated = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    planned = torch_weight_bytes(shape_from_hf_config(tmp_path), "fp32", is_tied=model.config.is_tied,
                                 has_qkv_bias=model.config.has_qkv_bias)
    assert allocated == planned
