"""From ModelSettings' devices to llama.cpp's model parameters: split_mode, tensor_split, main_gpu, n_gpu_layers.

Pure: the mapping is tested without GPUs against a re-implementation of llama.cpp's rule
(llama-model.cpp, load_tensors, llama-cpp-python 0.3.36). That rule: the n_layer blocks and
the output head form n_layer + 1 slots, the head being slot n_layer. The last n_gpu_layers
slots are offloaded; slot s of them goes to the first GPU whose cumulative, normalised
tensor_split share exceeds s / n_gpu_layers, GPUs taken in ordinal order. token_embd always
stays in host memory. So a GPU's share here is its planned blocks, plus one on the last GPU
for the head, and n_gpu_layers counts the head: the slot boundaries then fall exactly on
the plan's, in float32 too, since both sides of each comparison round the same quotient.

tensor_split holds one share per GPU ordinal (llama_max_devices() slots), so `cuda:0,cuda:2`
fills slots 0 and 2, and GPUs listed out of ordinal order still run in ordinal order: the
planner plans in that order (memplanner.split.execution_order). One device alone is
split_mode none with main_gpu its ordinal: how a draft gets a GPU of its own. In a row split,
main_gpu is the first device, which keeps the small tensors and the intermediate results, and
the shares are each GPU's fraction of every matrix. CPU devices run what is not offloaded, so
they must come before the GPUs. With cpu:N devices only nothing is offloaded and the split
parameters are set all the same: llama.cpp's CPU backend is one device and ignores them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp

from memplanner.device import is_gpu
from memplanner.split import device_ordinal, layer_counts
from pocketspec.errors import UserError
from pocketspec.settings import ModelSettings

SPLIT_MODES = {"layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER, "row": llama_cpp.LLAMA_SPLIT_MODE_ROW}


@dataclass(frozen=True)
class LlamaSplit:
    split_mode: int
    main_gpu: int
    tensor_split: tuple[float, ...] | None  # one share per GPU ordinal; None: llama.cpp's own choice
    n_gpu_layers: int


def llama_split(settings: ModelSettings, num_layers: int, max_devices: int) -> LlamaSplit:
    """llama.cpp's parameters for `settings.devices` (none given: the settings' own gpu_layers, unsplit)."""
    devices = settings.devices
    if not devices:
        return LlamaSplit(llama_cpp.LLAMA_SPLIT_MODE_LAYER, 0, None, settings.gpu_layers)
    if is_cpu_planned(settings):  # cpu:N devices offload nothing, whatever --gpu-layers says
        mode = SPLIT_MODES.get(settings.split_mode, llama_cpp.LLAMA_SPLIT_MODE_LAYER) if len(devices) > 1 else (
            llama_cpp.LLAMA_SPLIT_MODE_LAYER)
        return LlamaSplit(mode, 0, None, 0)
    listed = ",".join(devices)
    gpus = [device for device in devices if is_gpu(device)]
    ordinals = [device_ordinal(device) for device in gpus]
    if max(ordinals) >= max_devices:
        raise UserError(f"--devices {listed}: this llama.cpp build numbers at most {max_devices} GPUs")
    if len(set(ordinals)) != len(ordinals):
        raise UserError(f"--devices {listed}: a GPU is listed twice (cuda and cuda:0 are the same GPU)")
    num_cpu = devices.index(gpus[0])
    if not all(is_gpu(device) for device in devices[num_cpu:]):
        raise UserError(f"--devices {listed}: llama.cpp runs the first blocks on the CPU and offloads "
                        "the rest, so list cpu devices before the GPUs")
    if len(devices) == 1:
        return LlamaSplit(llama_cpp.LLAMA_SPLIT_MODE_NONE, ordinals[0], None, -1)
    if settings.split_mode not in SPLIT_MODES:
        raise UserError(f"--split-mode {settings.split_mode!r}: llama.cpp splits by layer or row")
    if settings.split_mode == "row" and num_cpu > 0:
        raise UserError("--split-mode row splits every matrix over GPUs; it cannot include a cpu device")
    counts = layer_counts(settings.layers_per_device, num_layers, len(devices))
    by_ordinal = sorted(zip(ordinals, counts[num_cpu:]))
    shares = [0.0] * max_devices
    for ordinal, count in by_ordinal:
        shares[ordinal] = float(count)
    if settings.split_mode == "row":
        return LlamaSplit(SPLIT_MODES["row"], ordinals[0], tuple(shares), -1)
    shares[by_ordinal[-1][0]] += 1.0  # the output head's slot, on the last GPU
    num_offloaded = sum(count for _, count in by_ordinal)
    return LlamaSplit(SPLIT_MODES["layer"], ordinals[0], tuple(shares), num_offloaded + 1)


def is_cpu_planned(settings: ModelSettings) -> bool:
    """No block offloaded: cpu:N devices only, or no devices and no --gpu-layers. Such a model's
    context gets op_offload off, or a GPU build would still copy its weights to the GPU for every
    batch of 32 tokens or more (ggml's scheduler offloads those ops; llama-context.cpp, op_offload)."""
    if settings.devices:
        return not any(is_gpu(device) for device in settings.devices)
    return settings.gpu_layers == 0


def apply_llama_split(model_params, split: LlamaSplit):
    """Set the split on llama_model_params; returns the tensor_split array, which must outlive the load."""
    model_params.n_gpu_layers = split.n_gpu_layers
    model_params.split_mode = split.split_mode
    model_params.main_gpu = split.main_gpu
    if split.tensor_split is None:
        return None
    shares = (ctypes.c_float * len(split.tensor_split))(*split.tensor_split)
    model_params.tensor_split = shares
    return shares
