"""The torch model on tiny F32 GGUF models: it computes what llama.cpp computes, and its KV cache
rolls back and slides exactly like a fresh prefill."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pocketspec.backends.llama_cpp_backend import LlamaCppBackend
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.settings import ModelSettings
from pocketspec.torch_model.gguf_weights import unpermute_qk
from pocketspec.torch_model.kv_cache import StaticKVCache
from pocketspec.torch_model.model import ModelConfig, Transformer, causal_attention
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENS = [1] + [(17 * index + 5) % 300 + 3 for index in range(95)]


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("tiny_f32")
    (folder / "one").mkdir()
    models = {arch: write_tiny_pair(folder, arch=arch, quant=None)[0] for arch in ("llama", "qwen2")}
    # one layer: its keys and values depend only on token and position, so a slid cache
    # must equal a fresh prefill of the window (deeper layers saw the dropped tokens)
    models["one_layer"] = write_tiny_pair(folder / "one", arch="llama", quant=None, num_layers=1)[0]
    return models


def _torch_backend(path, max_context=256, **settings) -> TorchBackend:
    return TorchBackend.open(path, ModelSettings(backend="torch", max_context=max_context, max_logits_rows=96,
                                                 **settings))


def _all_logits(backend, tokens) -> np.ndarray:
    backend.rollback(0)
    return np.array(backend.forward(tokens, range(len(tokens))))


def test_unpermute_inverts_llama_cpp_permute():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((2 * 8, 5))
    # convert_hf_to_gguf.py's LlamaModel.permute
    permuted = weight.reshape(2, 2, 4, 5).swapaxes(1, 2).reshape(weight.shape)
    assert np.array_equal(unpermute_qk(permuted, num_heads=2), weight)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_f32_model_matches_llama_cpp(tiny_f32, arch):
    """llama permutes Q/K in the GGUF and qwen2 adds biases; both must give llama.cpp's logits."""
    with _torch_backend(tiny_f32[arch]) as torch_backend:
        assert torch_backend.model.config.has_qkv_bias == (arch == "qwen2")
        ours = _all_logits(torch_backend, TOKENS)
    reference = LlamaCppBackend(tiny_f32[arch], ModelSettings(max_context=256, max_logits_rows=96))
    try:
        theirs = _all_logits(reference, TOKENS)
    finally:
        reference.close()
    assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))
    assert np.abs(ours - theirs).max() < 1e-2 * np.abs(theirs).max()


def test_one_token_decoding_matches_a_batched_pass(tiny_f32):
    with _torch_backend(tiny_f32["llama"]) as backend:
        batched = _all_logits(backend, TOKENS)
        backend.rollback(0)
        singles = np.stack([backend.forward([token], [0])[0] for token in TOKENS])
    assert np.allclose(batched, singles, atol=1e-4)


def test_rollback_then_forward_equals_a_fresh_run(tiny_f32):
    with _torch_backend(tiny_f32["qwen2"]) as backend:
        backend.prefill(TOKENS[:60])
        backend.rollback(30)
        resumed = backend.forward(TOKENS[30:50], range(20)).copy()
        fresh = _all_logits(backend, TOKENS[:50])[30:]
        assert backend.num_cached == 50
    assert np.allclose(resumed, fresh, atol=1e-5)


@pytest.mark.parametrize("kv_dtype, tolerance", [("fp32", 1e-5), ("int8", 0.05)])
def test_shift_out_equals_a_fresh_prefill_of_the_window(tiny_f32, kv_dtype, tolerance):
    """Dropping 40 tokens after 4 sinks re-rotates the kept keys to their new positions."""
    with _torch_backend(tiny_f32["one_layer"], torch_kv_type=kv_dtype) as backend:
        backend.prefill(TOKENS[:80] + [TOKENS[80]])
        backend.rollback(80)
        backend.shift_out(4, 40)
        assert backend.cached_tokens == TOKENS[:4] + TOKENS[44:80]
        slid = backend.forward(TOKENS[80:84], range(4)).copy()
        window = TOKENS[:4] + TOKENS[44:84]
        fresh = _all_logits(backend, window)[-4:]
    assert np.array_equal(slid.argmax(-1), fresh.argmax(-1))
    assert np.abs(slid - fresh).max() < tolerance * np.abs(fresh).max()


def test_the_kv_cache_is_preallocated_and_never_grows(tiny_f32):
    with _torch_backend(tiny_f32["llama"], torch_kv_type="bf16") as backend:
        buffers = [tensor.data_ptr() for tensor in backend.cache.keys + backend.cache.values]
        assert backend.cache.keys[0].dtype == torch.bfloat16 and backend.cache.keys[0].shape[2] == 256
        backend.prefill(TOKENS)
        backend.rollback(10)
        backend.forward(TOKENS[:8], [7])
        assert [tensor.data_ptr() for tensor in backend.cache.keys + backend.cache.values] == buffers
        # 2 layers x (K + V) x 2 KV heads x 256 positions x 16 dims x 2 bytes
        assert backend.memory_report()["kv_cache"] == 2 * 2 * 2 * 256 * 16 * 2


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8", "int4"])
def test_loading_in_row_chunks_equals_loading_whole_tensors(tmp_path, monkeypatch, weights):
    from pocketspec.torch_model import gguf_weights
    from pocketspec.torch_model.load import load_model

    path = write_tiny_pair(tmp_path, seed=3)[0]  # quantized: each chunk dequantizes its own blocks
    whole = load_model(path, weights, torch.device("cpu"))
    monkeypatch.setattr(gguf_weights, "DEQUANTIZE_CHUNK_BYTES", 4 * 64 * 3)  # three rows of 64 at a time
    chunked = load_model(path, weights, torch.device("cpu"))
    expected, got = whole.state_dict(), chunked.state_dict()
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def _random_model(num_heads: int = 4, num_kv_heads: int = 2) -> tuple[Transformer, StaticKVCache]:
    torch.manual_seed(0)
    config = ModelConfig(arch="llama", num_layers=2, dim=64, num_heads=num_heads, num_kv_heads=num_kv_heads,
                         head_dim=16, ffn_dim=128, vocab_size=50)
    model = Transformer(config)
    torch.nn.init.normal_(model.tok_embeddings.weight)
    cache = StaticKVCache(num_layers=2, num_kv_heads=num_kv_heads, head_dim=16, max_context=32, kv_dtype="fp32",
                          device=torch.device("cpu"))
    return model.eval(), cache


def test_one_token_decoding_passes_no_mask(monkeypatch):
    """A lone query sees every cached key: no mask, so SDPA may take its flash kernels."""
    model, cache = _random_model()
    masks = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    with torch.inference_mode():
        model(torch.tensor([[3, 4, 5]]), 0, cache, torch.tensor([2]))
        assert all(mask is not None for mask in masks) and len(masks) == 2  # a prompt of 3 is masked
        masks.clear()
        decoded = model(torch.tensor([[6]]), 3, cache, torch.tensor([0]))
    assert masks == [None, None]
    fresh_model, fresh_cache = _random_model()
    with torch.inference_mode():  # the same as the token's row of a masked prefill
        prefilled = fresh_model(torch.tensor([[3, 4, 5, 6]]), 0, fresh_cache, torch.tensor([3]))
    assert torch.allclose(decoded, prefilled, atol=1e-5)


@pytest.mark.parametrize("num_tokens, start", [(1, 7), (4, 0), (5, 9)])
def test_expanding_grouped_keys_gives_the_same_attention(num_tokens, start):
    """The GPU path repeats keys and values to every query head (the masked fast kernel lacks GQA)."""
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, num_tokens, 16, generator=generator)
    keys, values = (torch.randn(2, 2, start + num_tokens, 16, generator=generator) for _ in range(2))
    grouped = causal_attention(q, keys, values, start, expand_groups=False)
    expanded = causal_attention(q, keys, values, start, expand_groups=True)
    assert torch.allclose(grouped, expanded, atol=1e-6)
    # query i sees keys 0 .. start + i: the last key moves only the last query
    changed_keys = keys.clone()
    changed_keys[:, :, -1] += 1.0
    moved = causal_attention(q, changed_keys, values, start, expand_groups=True)
    assert torch.equal(moved[:, :, :-1], expanded[:, :, :-1]) and not torch.equal(moved[:, :, -1], expanded[:, :, -1])


def test_fp16_keeps_the_residual_stream_in_float32():
    """Residual values past fp16's 65504 (Qwen2 reaches them) stay finite; every block still runs in fp16."""
    model, cache = _random_model()
    with torch.no_grad():
        model.tok_embeddings.weight.fill_(6e4)
        for block in model.layers:  # the normed rows are all ones, so attention adds 1e4 to every element
            block.attention.wv.weight.fill_(1 / 64)
            block.attention.wo.weight.fill_(1e4 / 64)
    tokens, rows = torch.tensor([[3, 4, 5, 6]]), torch.tensor([0, 1, 2, 3])
    with torch.inference_mode():
        expected = model(tokens, 0, cache, rows)
        half_cache = StaticKVCache(num_layers=2, num_kv_heads=2, head_dim=16, max_context=32, kv_dtype="fp16",
                                   device=torch.device("cpu"))
        got = model.half()(tokens, 0, half_cache, rows)
    assert torch.isfinite(got).all()
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()
