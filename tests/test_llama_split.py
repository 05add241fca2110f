"""llama.cpp's split parameters from the devices and the plan's layer split (pure), checked against a
re-implementation of llama.cpp's own assignment rule, and, on this CPU build, which cannot split
anything, that a load given GPU split parameters still generates the same tokens as a plain load."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_memplanner_split import TARGET

from memplanner.planner import Workload
from memplanner.split import DeviceBudget, even_layer_counts, plan_split
from pocketspec.backends.llama_cpp_backend import LlamaCppBackend
from pocketspec.backends.llama_split import LlamaSplit, apply_llama_split, is_cpu_planned, llama_split
from pocketspec.errors import UserError
from pocketspec.settings import ModelSettings

LAYER, ROW, NONE = llama_cpp.LLAMA_SPLIT_MODE_LAYER, llama_cpp.LLAMA_SPLIT_MODE_ROW, llama_cpp.LLAMA_SPLIT_MODE_NONE


def _split(devices, layers_per_device=(), split_mode="layer", num_layers=28, max_devices=4) -> LlamaSplit:
    settings = ModelSettings(devices=tuple(devices), layers_per_device=tuple(layers_per_device), split_mode=split_mode)
    return llama_split(settings, num_layers, max_devices)


CPU = None  # a slot llama.cpp leaves on the CPU


def llama_cpp_slot_devices(split: LlamaSplit, num_layers: int, num_gpus: int) -> list[int | None]:
    """llama.cpp's rule (llama-cpp-python 0.3.36, llama-model.cpp load_tensors, and llama.cpp's
    model device list) re-implemented: the GPU ordinal of each of the num_layers + 1 slots, the
    last being the output head; float32 like the C++. tensor_split all zero splits by free memory
    there: equal GPUs here."""
    gpus = [split.main_gpu] if split.split_mode == NONE else list(range(num_gpus))
    n_gpu_layers = split.n_gpu_layers if split.n_gpu_layers >= 0 else num_layers + 1
    shares = np.zeros(len(gpus), np.float32)
    if split.tensor_split is not None:
        shares = np.asarray(split.tensor_split[:len(gpus)], np.float32)
    if not shares.any():
        shares = np.ones(len(gpus), np.float32)
    cumulative, total = np.zeros(len(gpus), np.float32), np.float32(0)
    for index, share in enumerate(shares):
        total = np.float32(total + share)
        cumulative[index] = total
    cumulative = cumulative / total
    i_gpu_start = max(num_layers + 1 - n_gpu_layers, 0)
    act_gpu_layers = min(n_gpu_layers, num_layers + 1)
    found = []
    for slot in range(num_layers + 1):
        if slot < i_gpu_start or slot - i_gpu_start >= act_gpu_layers:
            found.append(CPU)
            continue
        point = np.float32(slot - i_gpu_start) / np.float32(act_gpu_layers)
        found.append(gpus[int(np.searchsorted(cumulative, point, side="right"))])
    return found


def planned_slot_devices(devices, counts) -> list[int | None]:
    """What the plan means: CPU devices first, then each GPU's run of blocks in ordinal order, and
    the head on the last GPU (on the CPU when there is none)."""
    gpus = sorted((int(device.partition(":")[2] or 0), count) for device, count in zip(devices, counts)
                  if not device.startswith("cpu"))
    on_cpu = sum(count for device, count in zip(devices, counts) if device.startswith("cpu"))
    found = [CPU] * on_cpu + [ordinal for ordinal, count in gpus for _ in range(count)]
    return found + [gpus[-1][0] if gpus else CPU]


@st.composite
def device_splits(draw):
    """CPU devices, then GPUs with distinct ordinals in any order, and blocks per device (some none)."""
    num_layers = draw(st.integers(1, 96))
    cpus = [f"cpu:{index}" for index in range(draw(st.integers(0, 2)))]
    gpus = [f"cuda:{ordinal}" for ordinal in draw(st.permutations(range(8)))[:draw(st.integers(1, 4))]]
    devices = cpus + gpus
    cuts = sorted(draw(st.lists(st.integers(0, num_layers), min_size=len(devices) - 1, max_size=len(devices) - 1)))
    counts = [high - low for low, high in zip([0, *cuts], [*cuts, num_layers])]
    return devices, counts, num_layers


@settings(max_examples=400, deadline=None)
@given(device_splits(), st.booleans())
def test_llama_cpp_loads_exactly_the_planned_blocks_and_head(found, is_planned):
    devices, counts, num_layers = found
    split = _split(devices, counts if is_planned else (), num_layers=num_layers, max_devices=16)
    counts = counts if is_planned else _even(num_layers, len(devices))
    assert llama_cpp_slot_devices(split, num_layers, num_gpus=8) == planned_slot_devices(devices, counts)


def _even(num_layers, num_devices):
    return list(even_layer_counts(num_layers, num_devices))


def test_the_head_slot_no_longer_moves_the_boundaries():
    """The issue's example: 14/14 of 28 blocks was loaded as 15 / 13 + head, and a CPU then GPU
    split gave the CPU one block more than planned."""
    even = _split(["cuda:0", "cuda:1"], [14, 14])
    assert llama_cpp_slot_devices(even, 28, 2) == [0] * 14 + [1] * 15
    mixed = _split(["cpu:0", "cuda:0"], [10, 18])
    assert llama_cpp_slot_devices(mixed, 28, 1) == [CPU] * 10 + [0] * 19


def test_gpu_layer_split_fills_the_slots_of_its_ordinals():
    assert _split(["cuda:0", "cuda:2"], [20, 8]) == LlamaSplit(LAYER, 0, (20.0, 0.0, 9.0, 0.0), 29)
    assert _split(["rocm:1", "rocm:0"], split_mode="row") == LlamaSplit(ROW, 1, (14.0, 14.0, 0.0, 0.0), -1)


def test_gpus_listed_out_of_order_keep_their_blocks_in_ordinal_order():
    """llama.cpp runs its GPUs by ordinal: cuda:0's 8 blocks come first, and the head goes with cuda:1."""
    assert _split(["cuda:1", "cuda:0"], [20, 8]) == LlamaSplit(LAYER, 1, (8.0, 21.0, 0.0, 0.0), 29)


def test_a_device_alone_is_split_mode_none_on_its_gpu():
    """How a draft gets a GPU of its own (`-devd` in llama.cpp's tools)."""
    assert _split(["cuda:3"]) == LlamaSplit(NONE, 3, None, -1)
    assert _split(["cpu:1"]) == LlamaSplit(LAYER, 0, None, 0)


def test_cpu_devices_keep_the_first_blocks_and_the_gpus_take_the_rest():
    assert _split(["cpu:0", "cuda:0"], [10, 18]) == LlamaSplit(LAYER, 0, (19.0, 0.0, 0.0, 0.0), 19)
    assert _split(["cpu:0", "cpu:1"], [10, 18]) == LlamaSplit(LAYER, 0, None, 0)
    assert _split([]) == LlamaSplit(LAYER, 0, None, 0)


def test_a_cpu_planned_model_offloads_nothing_whatever_gpu_layers_says():
    """A draft the plan put on cpu:0 inherits the target's --gpu-layers; it must stay on the CPU, and
    its context must not send big batches' ops to the GPU (op_offload)."""
    cpu_draft = ModelSettings(devices=("cpu:0",), gpu_layers=-1)
    assert llama_split(cpu_draft, 24, 16).n_gpu_layers == 0 and is_cpu_planned(cpu_draft)
    assert is_cpu_planned(ModelSettings()) and not is_cpu_planned(ModelSettings(gpu_layers=-1))
    assert not is_cpu_planned(ModelSettings(devices=("cpu:0", "cuda:0")))


@pytest.mark.parametrize("listed, budgets", [
    (["cuda:1", "cuda:0"], [3.0, 1.5]), (["cuda:0", "cuda:1", "cuda:2"], [1.0, 1.2, 1.0]),
    (["cpu:0", "cuda:0"], [1.5, 1.2]), (["cuda:2", "cpu:0", "cuda:0"], [1.0, 1.0, 1.0]),
])
def test_the_planned_split_loads_as_planned(listed, budgets):
    """plan_split, then the settings apply_split makes of it, then llama.cpp's rule: every device holds
    the blocks its share says, and the plan's last device the head."""
    gib = 2**30
    plan = plan_split([DeviceBudget(name, int(size * gib)) for name, size in zip(listed, budgets)], TARGET, None,
                      Workload(max_context=4096))
    assert plan.feasible
    devices = [share.device for share in plan.shares]
    split = _split(devices, [share.num_layers for share in plan.shares], num_layers=28, max_devices=16)
    loaded = llama_cpp_slot_devices(split, 28, num_gpus=3)
    for share in plan.shares:
        expected = CPU if share.device.startswith("cpu") else int(share.device.partition(":")[2])
        assert loaded[share.first_layer:share.first_layer + share.num_layers] == [expected] * share.num_layers
    assert loaded[-1] == int(devices[-1].partition(":")[2])


@pytest.mark.parametrize("devices, split_mode, message", [
    (["cuda:0", "cpu:0"], "layer", "list cpu devices before the GPUs"),
    (["cpu:0", "cuda:0"], "row", "cannot include a cpu device"),
    (["cuda:0", "cuda:7"], "layer", "at most 4 GPUs"),
    (["cuda", "cuda:0"], "layer", "listed twice"),
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
            if devices == ("cuda:0", "cuda:1"):  # what the load was given: 18 blocks and the head on cuda:1
                params = llama_cpp.llama_model_default_params()
                shares = apply_llama_split(params, llama_split(settings, 30, llama_cpp.llama_max_devices()))
                assert shares is not None and params.tensor_split[:3] == [12.0, 19.0, 0.0]
                assert params.n_gpu_layers == 31 and params.split_mode == LAYER
            tokens = [int(np.argmax(backend.prefill(backend.tokenizer.encode("The capital of France is", add_bos=True))))]
            while len(tokens) < 16:
                tokens.append(int(np.argmax(backend.forward(tokens[-1:], [0])[0])))
            outputs.append(tokens)
    assert all(tokens == outputs[0] for tokens in outputs)
