"""The torch backend on a CUDA/ROCm GPU (skipped, and counted, where torch sees none)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import assert_drafted_past_its_window, built_engine
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.settings import ModelSettings
from tiny_models import write_tiny_pair

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA/ROCm GPU")]
TOKENS = [1] + [(13 * index + 7) % 300 + 3 for index in range(40)]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_gpu"), quant=None)[0]


def _logits(path, device: str, weights: str) -> np.ndarray:
    settings = ModelSettings(backend="torch", device=device, weights=weights, max_context=128, max_logits_rows=64)
    with TorchBackend.open(path, settings) as backend:
        assert backend.cache.keys[0].device.type == ("cuda" if device != "cpu" else "cpu")
        return np.array(backend.forward(TOKENS, range(len(TOKENS))))


@pytest.mark.parametrize("weights, tolerance", [("fp32", 1e-3), ("bf16", 0.1), ("int8", 0.1), ("int4", 0.5)])
def test_gpu_logits_match_the_cpu(tiny_target, weights, tolerance):
    expected = _logits(tiny_target, "cpu", "fp32")
    got = _logits(tiny_target, "cuda", weights)
    assert np.abs(got - expected).max() < tolerance * np.abs(expected).max()


def test_self_sparse_on_gpu_equals_plain_in_fp32(tiny_target):
    settings = dict(backend="torch", weights="fp32", device="cuda")
    with built_engine(tiny_target, drafter="none", max_context=512, **settings) as plain:
        expected = plain.generate(plain.target.tokenizer.encode("the cat is", add_bos=True), 200).tokens
    with built_engine(tiny_target, drafter="model", gamma=4, max_context=512, self_draft="self-sparse",
                      self_draft_settings=dict(self_draft_window=96), **settings) as engine:
        prompt = engine.target.tokenizer.encode("the cat is", add_bos=True)
        result = engine.generate(prompt, 200)
        assert engine.target.device.type == "cuda"
        assert_drafted_past_its_window(engine, result, len(prompt), gamma=4)
    assert result.tokens == expected


def test_the_peak_reads_every_gpu_not_only_the_current_one():
    """A draft or a split device on another GPU counts too; with one GPU, a block on it while the
    current device is it still shows, and a second GPU's block is read when there is one."""
    from pocketspec.stats import gpu_allocator_peaks

    ordinals = range(min(2, torch.cuda.device_count()))
    blocks = [torch.empty(64 * 2**20, dtype=torch.uint8, device=f"cuda:{ordinal}") for ordinal in ordinals]
    with torch.cuda.device(0):
        peaks = gpu_allocator_peaks()
    assert all(peaks[f"cuda:{ordinal}"] >= 64 * 2**20 for ordinal in ordinals)
    reserved = gpu_allocator_peaks(reserved=True)
    assert all(reserved[name] >= peak for name, peak in peaks.items())
    del blocks
