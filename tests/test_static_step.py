"""The static decode step (pocketspec/torch_model/static_step.py) on the CPU: the dynamic path's tokens
(greedy, every drafter; the same distribution when sampling), one host read per step, and no
recompilation once compiled."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import assert_matches_plain, built_engine, same_distribution_pvalue, sampled_token_counts
from pocketspec.torch_model.model import masked_attention
from pocketspec.torch_model.static_step import StaticDecodeStep, bucket_widths
from pocketspec.torch_model.step_attention import flex_grouped_attention, grouped_attention, grouped_sdpa, key_blocks
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT_TEXT = "the cat is def return"
TORCH = dict(backend="torch", weights="fp32")


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_static"), quant=None)


def _prompt(engine) -> list[int]:
    return engine.target.tokenizer.encode(PROMPT_TEXT, add_bos=True)


def _generate(target, num_tokens: int, **options):
    with built_engine(target, **TORCH, **options) as engine:
        result = engine.generate(_prompt(engine), num_tokens)
        assert (engine.target.static_step is not None) == (options.get("decode_step") == "static")
        return result


def test_buckets_are_powers_of_two_then_the_verify_width():
    assert bucket_widths(1) == [1]
    assert bucket_widths(8) == [1, 2, 4, 8]
    assert bucket_widths(32) == [1, 2, 4, 8, 16, 32]
    assert bucket_widths(12) == [1, 2, 4, 8, 12]


def test_a_step_near_the_end_of_the_cache_is_not_padded_past_it(tiny_pair):
    target, _ = tiny_pair
    with built_engine(target, drafter="ngram", decode_step="static", max_context=64, **TORCH) as engine:
        step = engine.target.static_step
        assert step.bucket(3, 10) == 4 and step.bucket(1, 63) == 1
        assert step.bucket(3, 61) == 3  # a bucket of 4 would write position 64


@pytest.mark.parametrize("options", [dict(drafter="none"), dict(drafter="ngram", gamma=4),
                                     dict(drafter="model", gamma=3, use_draft=True),
                                     dict(drafter="model", gamma=4, self_draft="self-sparse", max_context=512,
                                          self_draft_settings=dict(self_draft_window=96, self_draft_kv_type="int8"))])
def test_greedy_tokens_equal_the_dynamic_path(tiny_pair, options):
    target, draft = tiny_pair
    options = dict(options)
    if options.pop("use_draft", False):
        options["draft_path"] = draft
    dynamic = _generate(target, 120, decode_step="dynamic", **options)
    static = _generate(target, 120, decode_step="static", **options)
    assert static.tokens == dynamic.tokens
    if options["drafter"] != "none":
        assert static.stats.num_accepted > 0


def test_padded_logits_equal_the_dynamic_forward(tiny_pair):
    """Three tokens padded to a bucket of four, over the whole cache: the dynamic forward's logits."""
    target, _ = tiny_pair
    with built_engine(target, drafter="ngram", decode_step="static", **TORCH) as engine:
        backend = engine.target
        prompt = _prompt(engine)
        backend.prefill(prompt)
        static = backend.forward([5, 6, 7], range(3))
        backend.static_step = None  # the same backend, now dynamic
        backend.rollback(len(prompt))
        dynamic = backend.forward([5, 6, 7], range(3))
    np.testing.assert_allclose(static, dynamic, rtol=1e-5, atol=1e-5)


def test_smollm2_greedy_equals_plain_dynamic_decoding(smollm2_path):
    with built_engine(smollm2_path, drafter="none", decode_step="dynamic", **TORCH) as plain:
        prompt = plain.tokenizer.encode("Write a Python function that returns the sum of a list.", add_bos=True)
        expected = plain.generate(prompt, 64).tokens
        with built_engine(smollm2_path, drafter="auto", decode_step="static", **TORCH) as engine:
            got = engine.generate(prompt, 64).tokens
        assert_matches_plain(plain.target, prompt, got, expected)


@pytest.mark.parametrize("self_draft", [None, "self-sparse"])
def test_static_speculative_sampling_keeps_the_target_distribution(tiny_pair, self_draft):
    """Two-sample χ² at the third generated token: static speculative sampling vs dynamic plain sampling."""
    target, draft = tiny_pair
    num_runs, position = 1200, 2
    with built_engine(target, drafter="none", temperature=1.0, decode_step="dynamic", **TORCH) as plain:
        plain_counts = sampled_token_counts(plain, _prompt(plain), position, num_runs)
    with built_engine(target, draft_path=None if self_draft else draft, drafter="model", gamma=3, temperature=1.0,
                      self_draft=self_draft, decode_step="static", **TORCH) as engine:
        spec_counts = sampled_token_counts(engine, _prompt(engine), position, num_runs)
        assert engine.controller.acceptance["model"].num_tried > 0
        assert engine.model.backend.static_step is not None
    assert same_distribution_pvalue(plain_counts, spec_counts, num_runs) > 1e-3


class ScalarReads(TorchDispatchMode):
    """Counts the operators that read a device value into Python (.item(), int(), bool() of a tensor):
    each one makes a GPU wait."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_step_reads_the_device_once(tiny_pair, temperature):
    target, draft = tiny_pair
    with built_engine(target, draft_path=draft, drafter="model", gamma=3, temperature=temperature,
                      decode_step="static", **TORCH) as engine:
        prompt = _prompt(engine)
        engine.generate(prompt, 8)  # the caches warm
        target_step, draft_step = engine.target.static_step, engine.model.backend.static_step
        target_step.num_host_reads = target_step.num_host_bytes = draft_step.num_host_reads = 0
        with ScalarReads() as scalar_reads:
            result = engine.generate(prompt, 40)
        assert scalar_reads.count == 0
        # one read for the prompt's last logits, then one verdict (2 integers) per step
        vocab_bytes = 4 * engine.target.vocab_size
        assert target_step.num_host_reads == 1 + result.stats.num_steps
        assert target_step.num_host_bytes == vocab_bytes + 16 * result.stats.num_steps
        # the draft reads back each token it chooses, never its logits
        assert draft_step.num_host_reads == result.stats.num_drafted


def test_compiled_step_gives_the_same_tokens_without_recompiling(tiny_pair, capsys):
    """Compiled (inductor on the CPU; CUDA graphs on a GPU) and warmed up for every bucket when it
    opens, with a bar for a watching terminal: generating then compiles nothing more."""
    import torch._dynamo

    target, _ = tiny_pair
    dynamic = _generate(target, 64, drafter="ngram", gamma=3, decode_step="dynamic", max_gamma=3)
    torch._dynamo.reset()
    with built_engine(target, drafter="ngram", gamma=3, decode_step="static", max_gamma=3, max_context=256,
                      compile=True, on_progress=lambda line: None, **TORCH) as engine:
        assert "compiling the target's decode step" in capsys.readouterr().err
        with torch._dynamo.config.patch(error_on_recompile=True):
            result = engine.generate(_prompt(engine), 64)
    assert result.tokens == dynamic.tokens


@pytest.mark.parametrize("drafter, self_draft", [("ngram", None), ("model", None), ("model", "self-sparse")])
def test_a_seeded_run_samples_what_plain_sampling_samples(tiny_pair, drafter, self_draft):
    """Every row draws the target's token for its position with the draws the drafter shared, and the draws
    move by the tokens emitted only, so no drafter changes a sampled token (verify.verify_sampled's rule,
    on the device; the draft model's draws on the device too)."""
    target, draft = tiny_pair
    with built_engine(target, drafter="none", temperature=0.7, seed=11, decode_step="static", **TORCH) as engine:
        assert engine.target.static_step is not None
        plain = engine.generate(_prompt(engine), 120)
    with built_engine(target, draft_path=draft if drafter == "model" and not self_draft else None, drafter=drafter,
                      gamma=4, self_draft=self_draft, temperature=0.7, seed=11, decode_step="static",
                      **TORCH) as engine:
        speculative = engine.generate(_prompt(engine), 120)
    assert speculative.stats.num_accepted > 0
    assert speculative.tokens == plain.tokens


@pytest.mark.parametrize("num_heads, num_kv_heads, width", [(12, 2, 1), (12, 2, 5), (9, 3, 8), (4, 4, 3)])
@pytest.mark.parametrize("attention", [grouped_attention, grouped_sdpa])
def test_folded_query_rows_attend_as_every_query_head_alone(num_heads, num_kv_heads, width, attention):
    """A GPU's static step folds each key/value head's query heads into query rows: the result equals
    repeating the keys and values for every query head (what the dynamic path does on a GPU)."""
    generator = torch.Generator().manual_seed(num_heads + width)
    q = torch.randn(1, num_heads, width, 32, generator=generator)
    keys, values = (torch.randn(1, num_kv_heads, 40, 32, generator=generator) for _ in range(2))
    mask = torch.arange(40)[None, :] <= torch.arange(20, 20 + width)[:, None]
    expected = masked_attention(q, keys, values, mask, expand_groups=True)
    torch.testing.assert_close(attention(q, keys, values, mask), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_heads, num_kv_heads, width, start", [(12, 2, 1, 1000), (12, 2, 2, 1000), (12, 2, 32, 700),
                                                                  (8, 2, 4, 126), (4, 4, 3, 5)])
def test_flex_attention_reads_the_filled_blocks_as_the_mask_allows(num_heads, num_kv_heads, width, start):
    """FlexAttention over the blocks key_blocks names equals the masked matmuls over the whole cache: whole
    blocks before the first query, partial ones up to the last, none after. Eager it applies the mask
    alone; compiled it also skips blocks (one query token is left out: torch 2.13's CPU template returns
    wrong rows there, which is why a CPU static step runs it eagerly)."""
    generator = torch.Generator().manual_seed(num_heads + width)
    max_context = 1100  # not a whole number of blocks
    q = torch.randn(1, num_heads, width, 32, generator=generator)
    keys, values = (torch.randn(1, num_kv_heads, max_context, 32, generator=generator) for _ in range(2))
    positions = torch.arange(start, start + width)
    mask = torch.arange(max_context)[None, :] <= positions[:, None]
    expected = grouped_attention(q, keys, values, mask)
    blocks = key_blocks(positions, max_context)
    runs = [flex_grouped_attention] + ([torch.compile(flex_grouped_attention, dynamic=False)] if width > 1 else [])
    for attention in runs:
        torch.testing.assert_close(attention(q, keys, values, positions, blocks), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_type", ["fp32", "int8"])
def test_flex_attention_and_a_compiled_cache_write_decode_the_dynamic_paths_tokens(tiny_pair, kv_type):
    """The GPU suite's compiled-flex-write step on the CPU: the cache written inside the compiled
    projection (quantized there for an int8 cache) and attended through FlexAttention gives the
    dynamic path's greedy tokens, decoding alone and verifying 4-token n-gram drafts."""
    import torch._dynamo

    target, _ = tiny_pair
    options = dict(drafter="ngram", gamma=4, max_gamma=4, max_context=256,
                   self_draft_settings=dict(torch_kv_type=kv_type))
    dynamic = _generate(target, 96, decode_step="dynamic", **options)
    torch._dynamo.reset()
    with built_engine(target, decode_step="static", **options, **TORCH) as engine:
        backend = engine.target
        backend.static_step = StaticDecodeStep(backend.model, backend.cache, num_layers=backend.num_layers,
                                               max_width=5, compile=True, attention="flex",
                                               writes_in_projection=True)
        result = engine.generate(_prompt(engine), 96)
    assert result.tokens == dynamic.tokens
    assert result.stats.num_accepted > 0


class OperatorCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


# The eager static step of the 2-block tiny model ran 174 operators on 2026-11-27: on a GPU every one
# is a launch when nothing is compiled (about 1,400 a token on Qwen2.5-1.5B), so growth is a cost.
MAX_OPERATORS_PER_TINY_STEP = 200


def test_an_eager_static_step_runs_no_more_operators_than_it_did(tiny_pair):
    target, _ = tiny_pair
    with built_engine(target, drafter="none", decode_step="static", **TORCH) as engine:
        engine.target.prefill(_prompt(engine))
        with OperatorCount() as operators:
            engine.target.static_step.logits([5], engine.target.num_cached)
    assert engine.target.num_layers == 2
    assert 0 < operators.count <= MAX_OPERATORS_PER_TINY_STEP


def test_a_compiler_that_fails_leaves_eager_decoding_with_a_note(tiny_pair, tmp_path, monkeypatch):
    """No C++ compiler for Inductor (a real failure, not a stand-in): the backend opens eager, says so
    once, and decodes the same tokens."""
    import torch._dynamo
    import torch._inductor.config

    target, _ = tiny_pair
    expected = _generate(target, 24, drafter="none", decode_step="dynamic")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}):
            with built_engine(target, drafter="none", decode_step="static", compile=True, **TORCH) as engine:
                result = engine.generate(_prompt(engine), 24)
                notes = list(engine.notes)
    finally:
        torch._dynamo.reset()
    assert [note for note in notes if note.startswith("torch.compile failed")] != []
    assert result.tokens == expected.tokens
