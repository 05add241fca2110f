"""BatchedModel on a tiny F32 model: every row of a ragged forward gets, bit for bit, the logits it
gets when decoded alone one token at a time, through rollbacks and whatever the other rows do."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from pocketspec.errors import ContextFullError
from pocketspec.batch.batched_model import BatchedModel
from pocketspec.settings import BatchSettings
from pocketspec.torch_model.invariant import TileShape, make_batch_invariant
from pocketspec.torch_model.load import load_model
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NUM_TOKENS = 10


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_batched"), quant=None)[0]


def _batched(path, num_rows: int, is_batch_invariant: bool = True, max_context: int = 256) -> BatchedModel:
    settings = replace(BatchSettings(), is_batch_invariant=is_batch_invariant, key_block=32)
    model = load_model(path, "fp32", torch.device("cpu"))
    tiles = TileShape(settings.row_tile) if is_batch_invariant else None
    if tiles is not None:
        make_batch_invariant(model, tiles)
    return BatchedModel(model, num_rows=num_rows, max_context=max_context, kv_dtype="fp32", n_batch=64,
                        settings=settings, tiles=tiles)


def _prompts(vocab_size: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[1, *rng.integers(3, vocab_size, length)] for length in (3, 40, 17, 90, 8)]


def _alone(path, prompt: list[int], is_batch_invariant: bool = True) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decoding of one prompt in a one-row model, one token per forward: tokens and their logits."""
    model = _batched(path, 1, is_batch_invariant)
    logits = [model.prefill(0, prompt)]
    tokens = []
    for _ in range(NUM_TOKENS):
        tokens.append(int(np.argmax(logits[-1])))
        logits.append(model.forward([0], [[tokens[-1]]], [1])[0][0])
    return tokens, logits[1:]


def _ragged_run(model: BatchedModel, prompts, references, seed: int = 1) -> tuple[int, int]:
    """Feed each row its reference tokens in random chunks (verify passes), with random rollbacks;
    returns (logits rows compared, rows that differ)."""
    rng = np.random.default_rng(seed)
    for row, prompt in enumerate(prompts):
        model.prefill(row, prompt)
    done = [0] * len(prompts)
    num_compared = num_different = 0
    while min(done) < NUM_TOKENS:
        rows = [row for row in range(len(prompts)) if done[row] < NUM_TOKENS and rng.random() < 0.7]
        counts = [min(int(rng.integers(1, 6)), NUM_TOKENS - done[row]) for row in rows]
        feeds = [references[row][0][done[row]:done[row] + count] for row, count in zip(rows, counts)]
        for row, count, logits in zip(rows, counts, model.forward(rows, feeds, counts) if rows else []):
            for offset in range(count):
                num_compared += 1
                num_different += not np.array_equal(logits[offset], references[row][1][done[row] + offset])
            done[row] += count
            if rng.random() < 0.3 and done[row] > 2:  # a rejection: the row drops its last tokens
                num_dropped = int(rng.integers(1, 3))
                done[row] -= num_dropped
                model.rollback(row, model.num_cached(row) - num_dropped)
    return num_compared, num_different


def test_ragged_forwards_equal_each_row_alone_bit_for_bit(tiny_target):
    model = _batched(tiny_target, 5)
    prompts = _prompts(model.model.config.vocab_size)
    references = [_alone(tiny_target, prompt) for prompt in prompts]
    num_compared, num_different = _ragged_run(model, prompts, references)
    assert num_compared > len(prompts) * NUM_TOKENS and num_different == 0


def test_fast_kernels_agree_closely_but_not_by_construction(tiny_target):
    model = _batched(tiny_target, 5, is_batch_invariant=False)
    prompts = _prompts(model.model.config.vocab_size)
    references = [_alone(tiny_target, prompt, is_batch_invariant=False) for prompt in prompts]
    rng = np.random.default_rng(2)
    for row, prompt in enumerate(prompts):
        model.prefill(row, prompt)
    rows = list(range(len(prompts)))
    counts = [int(rng.integers(1, 6)) for _ in rows]
    logits = model.forward(rows, [references[row][0][:count] for row, count in zip(rows, counts)], counts)
    for row, count in zip(rows, counts):
        assert np.allclose(logits[row], np.stack(references[row][1][:count]), atol=1e-4)


def test_prefilling_a_row_leaves_the_other_rows_alone(tiny_target):
    prompts = _prompts(64)[:3]
    alone = _batched(tiny_target, 1)
    alone.prefill(0, prompts[0])
    expected = alone.forward([0], [[7, 8]], [2])[0]
    model = _batched(tiny_target, 3)
    model.prefill(0, prompts[0])
    model.prefill(1, prompts[1])
    model.forward([1, 0], [[5, 6, 7], [9]], [3, 1])
    model.rollback(1, 0)
    model.rollback(0, len(prompts[0]))
    model.prefill(1, prompts[2])
    assert np.array_equal(model.forward([0], [[7, 8]], [2])[0], expected)


def test_a_row_cannot_pass_its_context(tiny_target):
    model = _batched(tiny_target, 2, max_context=48)
    model.prefill(0, list(range(3, 48)))
    with pytest.raises(ContextFullError):
        model.forward([0, 1], [[5, 6, 7, 8], [5]], [1, 1])


def test_batch_invariance_defaults_on_for_a_cpu_and_off_for_a_gpu(tiny_target):
    assert BatchSettings().batch_invariance_on("cpu") and not BatchSettings().batch_invariance_on("cuda")
    assert BatchSettings(is_batch_invariant=True).batch_invariance_on("cuda")
    assert not BatchSettings(is_batch_invariant=False).batch_invariance_on("cpu")
    model = load_model(tiny_target, "fp32", torch.device("cpu"))
    with pytest.raises(ValueError, match="make_batch_invariant"):  # the CPU default needs the wrapped model
        BatchedModel(model, num_rows=2, max_context=64, kv_dtype="fp32", n_batch=64, settings=BatchSettings())
    fast = BatchedModel(model, num_rows=2, max_context=64, kv_dtype="fp32", n_batch=64,
                        settings=BatchSettings(is_batch_invariant=False))
    assert fast.settings.is_batch_invariant is False and fast.tiles is None


def test_shifting_one_row_out_moves_only_that_rows_keys_as_a_single_sequence_cache_does(tiny_target):
    """A self-sparse draft's window (pocketspec/drafters/draft_window.py): dropping cached positions of one row
    of a batch re-rotates that row's later keys exactly as one sequence's cache does (StaticKVCache.shift, the
    single engine's sliding window), and leaves every other row's cache untouched, bit for bit."""
    rng = np.random.default_rng(4)
    tokens = [[1, *rng.integers(3, 200, 30)] for _ in range(2)]
    batch, alone = _batched(tiny_target, 2, is_batch_invariant=False), _batched(tiny_target, 1, is_batch_invariant=False)
    for row in range(2):
        batch.prefill(row, tokens[row])
    alone.prefill(0, tokens[0])
    other_before = [(keys[1].clone(), values[1].clone()) for keys, values in zip(batch.cache.keys, batch.cache.values)]
    batch.shift_out(0, 4, 10)
    alone.cache.shift(4, 10, len(tokens[0]), alone.model.inv_freq)
    alone.cached[0][4:14] = []
    assert batch.cached[0] == alone.cached[0] == tokens[0][:4] + tokens[0][14:] and batch.cached[1] == tokens[1]
    num_kept = len(batch.cached[0])
    for layer, (keys, values) in enumerate(zip(batch.cache.keys, batch.cache.values)):
        torch.testing.assert_close(keys[0, :, :num_kept], alone.cache.keys[layer][0, :, :num_kept], rtol=0, atol=0)
        torch.testing.assert_close(values[0, :, :num_kept], alone.cache.values[layer][0, :, :num_kept], rtol=0, atol=0)
        assert torch.equal(keys[1], other_before[layer][0]) and torch.equal(values[1], other_before[layer][1])
