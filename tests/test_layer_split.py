"""The torch backend's layer split over 2 devices simulated on the CPU (cpu:0, cpu:1): blocks, KV
caches and the head sit where the split says, the hidden state hops at the boundary, and greedy
output equals single-device plain decoding token for token, plain and speculative, on a tiny
random model and on SmolLM2."""

from __future__ import annotations

import pytest
import torch

from conftest import built_engine
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.errors import UserError
from pocketspec.settings import ModelSettings
from memplanner.split import even_layer_counts
from pocketspec.torch_model.layer_split import LayerSplit, hop_to
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TORCH = dict(backend="torch", weights="fp32")
SPLIT = dict(devices=("cpu:0", "cpu:1"), layers_per_device=(1, 3))  # the boundary sits after block 0
PROMPT_TEXT = "the cat is def return"
REPETITIVE_TEXT = "Copy this list exactly, twice: alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota\n"


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_split"), quant=None, num_layers=4)


def _generate(target, num_tokens: int, prompt_text: str = PROMPT_TEXT, **options) -> list[int]:
    with built_engine(target, **TORCH, **options) as engine:
        prompt = engine.target.tokenizer.encode(prompt_text, add_bos=True)
        result = engine.generate(prompt, num_tokens)
        if options.get("drafter", "auto") != "none":
            assert result.stats.num_drafted > 0
        if options.get("devices"):
            assert engine.target.model.output is not None  # a tied head has its own copy on the last device
        return result.tokens


def test_even_counts_and_refusals():
    assert even_layer_counts(30, 4) == (8, 8, 7, 7)
    assert LayerSplit.of(("cpu:0", "cpu:1"), (), 5).layers_per_device == (3, 2)
    with pytest.raises(UserError, match="does not give 2 devices"):
        LayerSplit.of(("cpu:0", "cpu:1"), (1, 1), 4)


def test_hop_moves_every_tensor_argument():
    args, kwargs = hop_to(torch.device("meta"))(None, (torch.ones(2), "cache", 3), {"sin": torch.zeros(1)})
    assert args[0].is_meta and args[1:] == ("cache", 3) and kwargs["sin"].is_meta


def test_blocks_caches_and_head_sit_where_the_split_says(tiny_pair):
    target, _ = tiny_pair
    settings = ModelSettings(max_context=256, **TORCH, **SPLIT)
    with TorchBackend.open(target, settings) as split, TorchBackend.open(target, ModelSettings(max_context=256, **TORCH)) as whole:
        by_device = split.memory_by_device()
        assert set(by_device) == {"cpu:0", "cpu:1"}
        assert by_device["cpu:1"]["kv_cache"] == 3 * by_device["cpu:0"]["kv_cache"]
        assert sum(terms["weights"] for terms in by_device.values()) == whole.memory_report()["weights"]
        assert split.memory_report() == whole.memory_report()
        def num_bytes(module) -> int:
            return sum(tensor.numel() * tensor.element_size() for tensor in module.parameters())

        block_bytes, model = num_bytes(whole.model.layers[0]), whole.model
        assert by_device["cpu:0"]["weights"] == num_bytes(model.tok_embeddings) + block_bytes + model.inv_freq.numel() * 4
        assert by_device["cpu:1"]["weights"] == 3 * block_bytes + num_bytes(model.norm) + num_bytes(model.output)


@pytest.mark.parametrize("options", [
    dict(drafter="none"),
    dict(draft_path="DRAFT", drafter="model", gamma=4),
    dict(drafter="ngram", gamma=4),
    dict(drafter="model", gamma=3, self_draft="self-skip", self_draft_settings=dict(self_skip_layers=2)),
    dict(drafter="model", gamma=4, max_context=512, self_draft="self-sparse",
         self_draft_settings=dict(self_draft_window=96, self_draft_kv_type="int8")),
], ids=["plain", "draft-model", "ngram", "self-skip", "self-sparse"])
def test_split_greedy_equals_single_device_plain(tiny_pair, options):
    target, draft = tiny_pair
    if options.get("draft_path") == "DRAFT":
        options = {**options, "draft_path": draft}
    num_tokens = 200 if "self_draft" in options else 64  # the self-sparse window slides past 96
    expected = _generate(target, num_tokens, drafter="none", max_context=options.get("max_context", 1024))
    assert _generate(target, num_tokens, **SPLIT, **options) == expected


@pytest.fixture(scope="module")
def smollm2_plain(smollm2_path):
    return _generate(smollm2_path, 40, REPETITIVE_TEXT, drafter="none")


@pytest.mark.real_model
@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_smollm2_split_equals_single_device_plain(smollm2_path, smollm2_plain, drafter):
    """SmolLM2 ties its head to the embedding: the last device gets its own head."""
    assert _generate(smollm2_path, 40, REPETITIVE_TEXT, drafter=drafter, gamma=4, devices=("cpu:0", "cpu:1"),
                     layers_per_device=(14, 16)) == smollm2_plain


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs that torch sees")
def test_two_gpu_split_equals_one_gpu_plain(tiny_pair):
    target, _ = tiny_pair
    gpu = dict(backend="torch", weights="fp32", device="cuda:0")
    with built_engine(target, drafter="none", **gpu) as plain:
        expected = plain.generate(plain.target.tokenizer.encode(PROMPT_TEXT, add_bos=True), 64).tokens
    with built_engine(target, drafter="ngram", gamma=4, backend="torch", weights="fp32",
                      devices=("cuda:0", "cuda:1"), layers_per_device=(1, 3)) as engine:
        result = engine.generate(engine.target.tokenizer.encode(PROMPT_TEXT, add_bos=True), 64)
        cache = engine.target.cache
        assert [keys.device.index for keys in cache.keys] == [0, 1, 1, 1]
        assert engine.target.model.output.weight.device.index == 1
    assert result.tokens == expected
