"""From ModelSettings' devices to llama.cpp's model parameters: split_mode, tensor_split, main_gpu, n_gpu_layers.

Pure: the mapping is tested without GPUs. llama.cpp numbers the GPUs of its build from 0, and
tensor_split holds one share per GPU ordinal (llama_max_devices() slots; llama.cpp normalises
them), so `cuda:0,cuda:2` with 20 and 8 blocks fills slots 0 and 2. One device alone is
split_mode none with main_gpu its ordinal: how a draft gets a GPU of its own. In a row split,
main_gpu is the first device, which keeps the small tensors and the intermediate results.
llama.cpp offloads the last n_gpu_layers blocks, so CPU devices (which run what is not
offloaded) must come before the GPUs. With cpu:N devices only nothing is offloaded and the
split parameters are set all the same: llama.cpp's CPU backend is one device and ignores them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp

from memplanner.device import is_gpu
from memplanner.split import layer_counts
from pocketspec.errors import UserError
from pocketspec.settings import ModelSettings

SPLIT_MODES = {"layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER, "row": llama_cpp.LLAMA_SPLIT_MODE_ROW}


@dataclass(frozen=True)
class LlamaSplit:
    split_mode: int
    main_gpu: int
    tensor_split: tuple[float, ...] | None  # one share per GPU ordinal; None: llama.cpp's own choice
    n_gpu_layers: int


def gpu_ordinal(device: str) -> int:
    """cuda:2 -> 2; cuda or rocm alone -> 0."""
    _, _, index = device.partition(":")
    return int(index or 0)


def llama_split(settings: ModelSettings, num_layers: int, max_devices: int) -> LlamaSplit:
    """llama.cpp's parameters for `settings.devices` (none given: the settings' own gpu_layers, unsplit)."""
    devices = settings.devices
    default = LlamaSplit(llama_cpp.LLAMA_SPLIT_MODE_LAYER, 0, None, settings.gpu_layers)
    if not devices or not any(is_gpu(device) for device in devices):
        if len(devices) > 1 and settings.split_mode in SPLIT_MODES:
            return LlamaSplit(SPLIT_MODES[settings.split_mode], 0, None, settings.gpu_layers)
        return default
    gpus = [device for device in devices if is_gpu(device)]
    if any(gpu_ordinal(device) >= max_devices for device in gpus):
        raise UserError(f"--devices {','.join(devices)}: this llama.cpp build numbers at most {max_devices} GPUs")
    first_gpu = devices.index(gpus[0])
    if not all(is_gpu(device) for device in devices[first_gpu:]):
        raise UserError(f"--devices {','.join(devices)}: llama.cpp runs the first blocks on the CPU and offloads "
                        "the rest, so list cpu devices before the GPUs")
    if len(devices) == 1:
        return LlamaSplit(llama_cpp.LLAMA_SPLIT_MODE_NONE, gpu_ordinal(devices[0]), None, -1)
    if settings.split_mode not in SPLIT_MODES:
        raise UserError(f"--split-mode {settings.split_mode!r}: llama.cpp splits by layer or row")
    if settings.split_mode == "row" and first_gpu > 0:
        raise UserError("--split-mode row splits every matrix over GPUs; it cannot include a cpu device")
    counts = layer_counts(settings.layers_per_device, num_layers, len(devices))
    shares = [0.0] * max_devices
    for device, count in zip(devices[first_gpu:], counts[first_gpu:]):
        shares[gpu_ordinal(device)] = float(count)
    num_offloaded = sum(counts[first_gpu:])
    return LlamaSplit(SPLIT_MODES[settings.split_mode], gpu_ordinal(gpus[0]), tuple(shares),
                      -1 if num_offloaded == num_layers else num_offloaded)


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
