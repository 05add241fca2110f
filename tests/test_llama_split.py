"""llama.cpp's split parameters from the devices and the plan's layer split (pure), and, on this CPU
build, which cannot split anything, that a load given GPU split parameters still generates the same
tokens as a plain load."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from pocketspec.backends.llama_cpp_backend import LlamaCppBackend
from pocketspec.backends.llama_split import LlamaSplit, llama_split
from pocketspec.errors import UserError
from pocketspec.settings import ModelSettings

LAYER, ROW, NONE = llama_cpp.LLAMA_SPLIT_MODE_LAYER, llama_cpp.LLAMA_SPLIT_MODE_ROW, llama_cpp.LLAMA_SPLIT_MODE_NONE


def _split(devices, layers_per_device=(), split_mode="layer", num_layers=28, max_devices=4) -> LlamaSplit:
    settings = ModelSettings(devices=tuple(devices), layers_per_device=tuple(layers_per_device), split_mode=split_mode)
    return llama_split(settings, num_layers, max_devices)


def test_gpu_layer_split_fills_the_slots_of_its_ordinals():
    assert _split(["cuda:0", "cuda:2"], [20, 8]) == LlamaSplit(LAYER, 0, (20.0, 0.0, 8.0, 0.0), -1)
    assert _split(["rocm:1", "rocm:0"], split_mode="row") == LlamaSplit(ROW, 1, (14.0, 14.0, 0.0, 0.0), -1)


def test_a_device_alone_is_split_mode_none_on_its_gpu():
    """How a draft gets a GPU of its own (`-devd` in llama.cpp's tools)."""
    assert _split(["cuda:3"]) == LlamaSplit(NONE, 3, None, -1)
    assert _split(["cpu:1"]) == LlamaSplit(LAYER, 0, None, 0)


def test_cpu_devices_keep_the_first_blocks_and_the_gpus_take_the_rest():
    assert _split(["cpu:0", "cuda:0"], [10, 18]) == LlamaSplit(LAYER, 0, (18.0, 0.0, 0.0, 0.0), 18)
    assert _split(["cpu:0", "cpu:1"], [10, 18]) == LlamaSplit(LAYER, 0, None, 0)
    assert _split([]) == LlamaSplit(LAYER, 0, None, 0)


@pytest.mark.parametrize("devices, split_mode, message", [
    (["cuda:0", "cpu:0"], "layer", "list cpu devices before the GPUs"),
    (["cpu:0", "cuda:0"], "row", "cannot include a cpu device"),
    (["cuda:0", "cuda:7"], "layer", "at most 4 GPUs"),
])
def test_splits_llama_cpp_cannot_run_are_refused(devices, split_mode, message):
    with pytest.raises(UserError, match=message):
        _split(devices, split_mode=split_mode)


@pytest.mark.real_model
def test_a_cpu_build_given_gpu_split_parameters_generates_the_same_tokens(smollm2_path):
    """This build has no GPU, so llama.cpp ignores the split; the parameters still reach the load."""
    assert not llama_cpp.llama_supports_gpu_offload()
    base = ModelSettings(max_context=256, max_logits_rows=1, num_threads=1)
    outputs = []
    for devices, layers, split_mode in [((), (), "layer"), (("cuda:0", "cuda:1"), (12, 18), "layer"),
                                        (("cuda:1", "cuda:0"), (), "row"), (("cuda:1",), (), "layer")]:
        settings = ModelSettings(**{**base.__dict__, "devices": devices, "layers_per_device": layers,
                                    "split_mode": split_mode})
        with LlamaCppBackend(smollm2_path, settings) as backend:
            if devices == ("cuda:0", "cuda:1"):
                assert list(backend._tensor_split)[:3] == [12.0, 18.0, 0.0]
            tokens = [int(np.argmax(backend.prefill(backend.tokenizer.encode("The capital of France is", add_bos=True))))]
            while len(tokens) < 16:
                tokens.append(int(np.argmax(backend.forward(tokens[-1:], [0])[0])))
            outputs.append(tokens)
    assert all(tokens == outputs[0] for tokens in outputs)
