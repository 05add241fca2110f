"""A layer split (pipeline) of the torch model over several devices, applied around model.py.

The first device holds the token embeddings, the last the final norm and the output head
(a tied head gets its own copy of the embedding there, as llama.cpp's layer split does),
and every device a run of consecutive blocks. A forward pre-hook on the first block of each
device's run moves the hidden state and the rope angles across the boundary, and one on the
final norm moves the hidden state to the head's device, so model.py's forward runs unchanged.
Each layer's KV cache lives with its layer (StaticKVCache's layer_devices).

Devices are named, and the hops follow names: `cpu:0` and `cpu:1` are one torch device, so
on a CPU the split, its caches and its hops run for real while moving nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from memplanner.split import layer_counts
from pocketspec.errors import UserError
from pocketspec.torch_model.device import resolve_device, resolve_devices
from pocketspec.torch_model.model import Transformer


@dataclass(frozen=True)
class LayerSplit:
    device_names: tuple[str, ...]
    layers_per_device: tuple[int, ...]

    @classmethod
    def of(cls, device_names: tuple[str, ...], layers_per_device: tuple[int, ...], num_layers: int) -> "LayerSplit":
        """The plan's split (or an even one when it gives none), checked against the model."""
        counts = layer_counts(layers_per_device, num_layers, len(device_names))
        if len(counts) != len(device_names) or sum(counts) != num_layers:
            raise UserError(f"the layer split {list(counts)} does not give {len(device_names)} devices "
                            f"the model's {num_layers} blocks")
        resolve_devices(tuple(device_names))
        return cls(tuple(device_names), tuple(counts))

    @property
    def first_device(self) -> str:
        return self.device_names[0]

    @property
    def last_device(self) -> str:
        return self.device_names[-1]

    @functools.cached_property
    def layer_device_names(self) -> tuple[str, ...]:
        """The device name of every block, in order."""
        return tuple(name for name, count in zip(self.device_names, self.layers_per_device) for _ in range(count))

    def device_name_for(self, parameter_name: str) -> str:
        """Where a parameter lives: `layers.N.*` with block N, the head at the end, the rest first."""
        parts = parameter_name.split(".")
        if parts[0] == "layers":
            return self.layer_device_names[int(parts[1])]
        if parts[0] in ("norm", "output"):
            return self.last_device
        return self.first_device

    def device_for(self, parameter_name: str) -> torch.device:
        return resolve_device(self.device_name_for(parameter_name))


def hop_to(device: torch.device):
    """A forward pre-hook that moves every tensor argument to `device`."""
    def move(value):
        return value.to(device) if isinstance(value, torch.Tensor) else value

    def hook(module, args, kwargs):
        return tuple(move(value) for value in args), {name: move(value) for name, value in kwargs.items()}

    return hook


def install_layer_split(model: Transformer, split: LayerSplit) -> None:
    """Untie the head onto the last device and hop the hidden state at every boundary (in place)."""
    if model.output is None and split.first_device != split.last_device:
        weight = model.tok_embeddings.weight
        with torch.device("meta"):
            model.output = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        # on one torch device (cpu:0, cpu:1) .to() returns the same tensor: no copy
        model.output.weight = nn.Parameter(weight.to(resolve_device(split.last_device)), requires_grad=False)
    previous = split.first_device
    for block, name in zip(model.layers, split.layer_device_names):
        if name != previous:
            block.register_forward_pre_hook(hop_to(resolve_device(name)), with_kwargs=True)
        previous = name
    # always: a layer-skip draft reaches the head from a block on any device
    model.norm.register_forward_pre_hook(hop_to(resolve_device(split.last_device)), with_kwargs=True)
    model.layer_split = split


def tensor_bytes_by_device(model: Transformer, device_name_for: Callable[[str], str]) -> dict[str, int]:
    """Bytes of the model's parameters and buffers on each named device (a tensor shared twice counts once)."""
    found: dict[str, int] = {}
    seen: set[tuple[torch.device, int]] = set()
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]:
        if (tensor.device, tensor.data_ptr()) in seen:
            continue
        seen.add((tensor.device, tensor.data_ptr()))
        device_name = device_name_for(name)
        found[device_name] = found.get(device_name, 0) + tensor.numel() * tensor.element_size()
    return found
