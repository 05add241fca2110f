"""memplanner.torch_peak: the torch backend's peak on hand-computed shapes, and `--memory-budget`
with `--backend torch` sizing n_batch or refusing in one line."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memplanner import terms
from memplanner.gpu_terms import TORCH_CUDA_CONTEXT_BYTES
from memplanner.shapes import ModelShape
from memplanner.torch_peak import (CPU_ACTIVATION_FACTOR, CPU_HEAP_RESERVE_BYTES, DEQUANTIZE_CHUNK_BYTES,
                                   ONEDNN_CACHED_PRIMITIVES, ONEDNN_PRIMITIVE_BYTES, TORCH_CPU_RUNTIME_BYTES,
                                   activation_bytes, device_sampling_bytes, gpu_views, graph_pool_bytes,
                                   quantized_matmul_bytes, load_staging_bytes, torch_peak_terms)
from memplanner.torch_sizes import INT8_DEQUANTIZE_SLICE_BYTES
from pocketspec.torch_model.onednn_caches import CACHE_VARIABLES, bound_onednn_caches
from test_cli_errors import assert_one_line_error, run_cli
from tiny_models import write_tiny_pair

TINY = ModelShape("tiny", "llama", 2, 64, 4, 2, 16, 1000, 500_000, 520_000, 2048, 128)


def test_activation_bytes_by_hand():
    # 8 tokens over 100 positions, fp32: hidden 4*8*(4*64 + 3*128), RoPE 4*3*8*(64 + 32), the mask
    # as booleans and floats 8*100*5, K and V repeated to 4 query heads 2*100*64*4, logits 2 rows * 1000 * (4 + 4)
    assert activation_bytes(TINY, 8, 100, 4, 2) == (4 * 8 * (256 + 384) + 4 * 3 * 8 * 96 + 8 * 100 * 5
                                                    + 2 * 100 * 64 * 4 + 2 * 1000 * 8)
    # int8 KV dequantizes keys and values of the whole context once, straight to the compute dtype
    extra = activation_bytes(TINY, 8, 100, 2, 2, kv_is_int8=True) - activation_bytes(TINY, 8, 100, 2, 2)
    assert extra == 2 * 100 * 32 * 2
    # on a GPU the math kernel's scores and softmax, the worst case: 2 x 4 heads x 8 x 100 in float32
    gpu_extra = activation_bytes(TINY, 8, 100, 2, 2, on_gpu=True) - activation_bytes(TINY, 8, 100, 2, 2)
    assert gpu_extra == 2 * 4 * 8 * 100 * 4


def test_quantized_linears_stage_bf16_rows_on_a_cpu_and_may_dequantize_on_a_gpu():
    assert quantized_matmul_bytes(TINY, "fp32", 4, is_tied=True, num_tokens=8) == 0
    # fused CPU kernels: bf16 copies of the down projection's 8 input rows (128) and its output (64)
    assert quantized_matmul_bytes(TINY, "int8", 4, is_tied=False, num_tokens=8) == 2 * 8 * (128 + 64)
    # int4's CPU kernel needs outputs in multiples of 16: the untied head of 1000 dequantizes
    assert quantized_matmul_bytes(TINY, "int4", 4, is_tied=True, num_tokens=8) == 2 * 8 * (128 + 64)
    assert quantized_matmul_bytes(TINY, "int4", 4, is_tied=False, num_tokens=8) == (2 * 64 * 1000 * 4
                                                                                      + 2 * 8 * (128 + 64))
    # on a GPU the largest weight, as the worst case: the feed-forward, or the untied head
    assert quantized_matmul_bytes(TINY, "int8", 2, is_tied=True, num_tokens=8, on_gpu=True) == 2 * 64 * 128 * 2
    assert quantized_matmul_bytes(TINY, "int4", 2, is_tied=False, num_tokens=8, on_gpu=True) == 2 * 64 * 1000 * 2


def test_cpu_peak_is_the_larger_of_loading_and_generating():
    small_kv = {"weights": 400_000, "target KV": 10_000}
    found = torch_peak_terms(TINY, small_kv, weights_format="fp32", max_context=100, n_batch=64, max_logits_rows=9)
    assert found["torch_runtime"] == TORCH_CPU_RUNTIME_BYTES
    assert found["tokenizer"] == terms.runtime_overhead_bytes("cpu") + terms.model_metadata_bytes(TINY)
    formula = max(activation_bytes(TINY, 64, 100, 4, 1), activation_bytes(TINY, 9, 100, 4, 9))
    activations = int(CPU_ACTIVATION_FACTOR * formula)  # glibc's retained heap on a CPU
    assert found["activations"] == activations
    # loading maps the whole file and stages a chunk; KV and activations do not exist yet
    loading = TINY.file_bytes + DEQUANTIZE_CHUNK_BYTES
    assert found["loading_excess"] == loading - 10_000 - activations
    generating = sum(found.values()) - found["loading_excess"]
    assert sum(found.values()) == max(generating, generating - 10_000 - activations + loading)
    big_kv = torch_peak_terms(TINY, {"weights": 400_000, "target KV": 10**9}, weights_format="fp32",
                              max_context=100, n_batch=64, max_logits_rows=9)
    assert big_kv["loading_excess"] == 0


def test_gpu_peak_is_tensors_activations_staging_allocator_reserve_and_context():
    tensors = {"weights": 400_000, "target KV": 10_000}
    found = torch_peak_terms(TINY, tensors, weights_format="bf16", max_context=100, n_batch=64, max_logits_rows=9,
                             on_gpu=True, tensor_sizes=[400_000, 5_000, 5_000])
    assert set(found) == {"weights", "target KV", "activations", "loading_excess", "allocator_reserve", "cuda_context"}
    assert found["cuda_context"] == TORCH_CUDA_CONTEXT_BYTES
    # three small tensors fill one 2 MiB segment; half the activations are planned as fragmentation
    assert found["allocator_reserve"] == 2 * 2**20 - 410_000 + found["activations"] // 2
    views = gpu_views(found)
    assert views["device"] == sum(found.values()) and views["device"] - views["reserved"] == TORCH_CUDA_CONTEXT_BYTES
    assert views["reserved"] - views["allocated"] == found["allocator_reserve"]
    assert found["activations"] == activation_bytes(TINY, 64, 100, 2, 1, on_gpu=True)
    assert found["loading_excess"] == DEQUANTIZE_CHUNK_BYTES - 10_000 - found["activations"]
    # quantizing to int8/int4 stages a second chunk of float32 temporaries
    assert load_staging_bytes("int8") == load_staging_bytes("int4") == 2 * load_staging_bytes("bf16")


def test_gpu_static_steps_add_their_graph_pools_beside_the_prompt_chunks_activations():
    tensors = {"weights": 400_000, "target KV": 10_000}
    common = dict(weights_format="bf16", max_context=100, n_batch=64, max_logits_rows=9, on_gpu=True,
                  tensor_sizes=[400_000, 5_000, 5_000])
    dynamic = torch_peak_terms(TINY, tensors, **common)
    static = torch_peak_terms(TINY, tensors, **common, static_steps=[(9, 100), (1, 40)])
    # the target's graphs keep logits for widths 1, 2, 4, 8 and 9; the widest one's temporaries are shared
    target_pool = 24 * TINY.vocab_size * 4 + activation_bytes(TINY, 9, 100, 2, 9, on_gpu=True)
    draft_pool = TINY.vocab_size * 4 + activation_bytes(TINY, 1, 40, 2, 1, on_gpu=True)
    assert graph_pool_bytes(TINY, 9, 100, 2, False, "bf16") == target_pool
    assert static["graph_pools"] == target_pool + draft_pool
    # beside the graphs: the eager prompt chunks' activations or the sampled verify's temporaries
    prefill = activation_bytes(TINY, 64, 100, 2, 1, on_gpu=True)
    assert static["activations"] == max(prefill, device_sampling_bytes(TINY.vocab_size, 9, on_gpu=True))
    assert dynamic["activations"] == max(prefill, activation_bytes(TINY, 9, 100, 2, 9, on_gpu=True))
    # an int8 verify dequantizes a slice of a weight inside the graph
    assert (graph_pool_bytes(TINY, 9, 100, 2, False, "int8") - target_pool == INT8_DEQUANTIZE_SLICE_BYTES
            and graph_pool_bytes(TINY, 1, 100, 2, False, "int8") == graph_pool_bytes(TINY, 1, 100, 2, False, "bf16"))
    # a CPU static step replays no graphs
    assert "graph_pools" not in torch_peak_terms(TINY, tensors, **{**common, "on_gpu": False}, static_steps=[(9, 100)])


def test_a_static_steps_sampled_verify_is_planned_where_it_outgrows_the_forwards():
    """A static step samples on the device after its forward: with a large vocabulary its float64
    temporaries, not the prompt chunks, are the widest moment beside the graphs (GPU) or the forwards (CPU)."""
    large_vocab = replace(TINY, vocab_size=150_000)
    tensors = {"weights": 400_000, "target KV": 10_000}
    common = dict(weights_format="bf16", max_context=100, n_batch=64, max_logits_rows=9,
                  tensor_sizes=[400_000, 5_000, 5_000])
    sampling = device_sampling_bytes(150_000, 9, on_gpu=True)
    assert sampling > activation_bytes(large_vocab, 64, 100, 2, 1, on_gpu=True)  # the prompt chunks'
    on_gpu = torch_peak_terms(large_vocab, tensors, **common, on_gpu=True, static_steps=[(9, 100)])
    assert on_gpu["activations"] == sampling
    assert torch_peak_terms(large_vocab, tensors, **common, on_gpu=True)["activations"] < sampling  # host sampling
    on_cpu = torch_peak_terms(large_vocab, tensors, **{**common, "weights_format": "fp32"}, static_steps=[(9, 100)])
    assert on_cpu["activations"] == int(CPU_ACTIVATION_FACTOR * device_sampling_bytes(150_000, 9))


def test_torch_budget_shrinks_prompt_chunks_then_refuses(smollm2_path):
    from pocketspec.session_settings import MODEL, SPECULATION
    from pocketspec.budget.torch_plan import torch_peak
    from pocketspec.loader import ModelChoice

    choice = ModelChoice(smollm2_path, None, "none")
    settings = replace(MODEL, backend="torch", max_context=8192, max_logits_rows=9)
    full, small = (sum(torch_peak(choice, replace(settings, n_batch=n), SPECULATION).values()) for n in (512, 64))
    assert small < full
    common = ("generate", "--backend", "torch", "--target", "smollm2-135m-instruct", "--draft", "none",
              "--prompt", "Hi", "--max-tokens", "2", "--max-context", "8192")
    least = small + CPU_HEAP_RESERVE_BYTES  # a CPU budget keeps the heap reserve free beside the peak
    shrunk = run_cli(*common, "--memory-budget", str(least))
    assert shrunk.returncode == 0, shrunk.stderr
    assert "prompt chunks n_batch 512 -> " in shrunk.stderr and "kept free" in shrunk.stderr
    refused = run_cli(*common, "--memory-budget", str(least - 1))
    assert_one_line_error(refused, "below the torch backend's predicted peak")


ONEDNN_GROWTH_SCRIPT = """
import sys
import pocketspec.torch_model.onednn_caches as onednn_caches
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.settings import ModelSettings
from pocketspec.stats import vm_hwm_bytes

onednn_caches.ONEDNN_CACHED_PRIMITIVES = int(sys.argv[2])  # read by load_model
backend = TorchBackend.open(sys.argv[1], ModelSettings(backend="torch", weights="bf16", max_context=256,
                                                       max_logits_rows=1, n_batch=256))
tokens = [(17 * index + 5) % (backend.vocab_size - 3) + 3 for index in range(200)]
backend.forward(tokens[:1], [0])
start = vm_hwm_bytes("self")
for width in range(2, 200):  # every width a new shape for each linear
    backend.rollback(0)
    backend.forward(tokens[:width], [width - 1])
print(vm_hwm_bytes("self") - start)
"""


def test_bf16_linears_kernel_caches_stay_within_their_planned_term(tmp_path):
    """A bf16 linear on a CPU caches a oneDNN kernel per input row count; 200 widths of a tiny model grew
    the process by hundreds of MiB before the caches were bounded. Now the growth stays near the term the
    plan counts for bf16 weights on a CPU (and only there). A fresh process: one whose earlier bf16 forwards
    made oneDNN read its cache sizes would not test the bound."""
    path = write_tiny_pair(tmp_path, quant=None)[0]
    kernels = ONEDNN_CACHED_PRIMITIVES * ONEDNN_PRIMITIVE_BYTES

    # without the bound an earlier test's load_model left in this worker's environment (a smaller one stays)
    environment = {name: value for name, value in os.environ.items() if name not in CACHE_VARIABLES}

    def growth(cache_entries: int) -> int:
        result = subprocess.run([sys.executable, "-c", ONEDNN_GROWTH_SCRIPT, str(path), str(cache_entries)],
                                capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=300,
                                env=environment)
        assert result.returncode == 0, result.stderr
        return int(result.stdout.split()[-1])

    if growth(1024) < 3 * kernels:  # torch's own bound: 533 MiB here (Zen 4)
        pytest.skip("this CPU's bf16 linears build no oneDNN kernel per row count")
    # bounded, 48 MiB here: a kernel's size differs by CPU, hence the margin
    assert growth(ONEDNN_CACHED_PRIMITIVES) <= 2 * kernels
    bf16 = torch_peak_terms(TINY, {"weights": 1}, weights_format="bf16", max_context=100, n_batch=64,
                            max_logits_rows=9)
    assert bf16["onednn_kernels"] == kernels
    assert "onednn_kernels" in torch_peak_terms(TINY, {"weights": 1}, weights_format="fp16", max_context=100,
                                                n_batch=64, max_logits_rows=9)
    for weights_format in ("fp32", "int8"):
        assert "onednn_kernels" not in torch_peak_terms(TINY, {"weights": 1}, weights_format=weights_format,
                                                        max_context=100, n_batch=64, max_logits_rows=9)
    assert "onednn_kernels" not in torch_peak_terms(TINY, {"weights": 1}, weights_format="bf16", max_context=100,
                                                    n_batch=64, max_logits_rows=9, on_gpu=True)


def test_a_smaller_cache_bound_the_environment_gives_stays(monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLES[0], "4")
    monkeypatch.setenv(CACHE_VARIABLES[1], "4096")
    bound_onednn_caches()
    assert [os.environ[name] for name in CACHE_VARIABLES] == ["4", str(ONEDNN_CACHED_PRIMITIVES)]
