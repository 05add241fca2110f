"""The static decode step, in the style of gpt-fast: fixed shapes, device positions, one host read per step.

The dynamic forward (model.py with an integer `start`) gives every step new shapes: the key
length grows, masks are built per call, inputs are new tensors, and the logits come back to
the host in full. A GPU then waits several times a step, and a CUDA graph cannot capture it.
Here, instead:

- a step's width is padded to a bucket (1, 2, 4, ... up to the verify width), so a compiled
  step sees a handful of shapes; padding rows sit after the real ones, every real row's mask
  hides them, and the real tokens that later reach those positions overwrite them;
- the position is a device tensor: RoPE angles and the causal mask over the whole cache
  ([width, max_context]) are computed from it, and keys and values are written with
  index_copy_ (KV cache `write_at`), so the host never needs a device value to place them;
- inputs go through reused buffers (pinned on a GPU) in asynchronous copies: one of the tokens
  and the position, and one of the uniform draws when sampling;
- the token choice and the verification run on the device (device_sampling.py), and the host
  reads back two integers. Every read from the device goes through `to_host`, which counts the
  reads and their bytes: tests/test_static_step.py checks there is one read of 16 bytes per step.

With `compile`, the step is torch.compile'd with mode="reduce-overhead" on a GPU (CUDA graphs;
the cache buffers are marked static so that their in-place writes stay in the graph) and
warmed up for every bucket when the backend opens, before anything is timed. On a CPU the
same code runs eagerly (or compiled without graphs), which is how the tests prove that it
gives the dynamic path's tokens.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from pocketspec.settings import SamplingSettings
from pocketspec.torch_model import device_sampling
from pocketspec.torch_model.model import masked_attention, rope_angles
from pocketspec.speculation.verify import Verdict


def bucket_widths(max_width: int) -> list[int]:
    """Powers of two below max_width, then max_width: the shapes a step is padded to."""
    widths = [1]
    while widths[-1] * 2 < max_width:
        widths.append(widths[-1] * 2)
    return widths + [max_width] if max_width > 1 else widths


class StaticPositions:
    """The model's `layout` for one static step: tokens at positions [T] held on the device."""

    def __init__(self, positions: torch.Tensor, inv_freq: torch.Tensor, max_context: int):
        self.positions = positions
        self.cos, self.sin = rope_angles(positions, inv_freq)
        key_positions = torch.arange(max_context, device=positions.device)
        self.mask = key_positions[None, :] <= positions[:, None]  # [T, max_context]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, layer: int) -> torch.Tensor:
        """q [1, heads, T, head_dim] over the whole cache, after writing k and v [1, kv_heads, T, head_dim]."""
        cache.write_at(layer, self.positions, k, v)
        keys, values = cache.read(layer, cache.max_context, dtype=q.dtype)
        return masked_attention(q, keys, values, self.mask, expand_groups=q.device.type != "cpu")


class StaticDecodeStep:
    def __init__(self, model, cache, *, num_layers: int, max_width: int, compile: bool = False):
        self.model, self.cache, self.num_layers = model, cache, num_layers
        self.device = model.tok_embeddings.weight.device
        self.widths = bucket_widths(max_width)
        self.num_host_reads = 0
        self.num_host_bytes = 0
        is_gpu = self.device.type == "cuda"
        # one host buffer for a step's integers: [tokens (padded), start]; one for its uniforms
        self._host_ints = torch.zeros(self.widths[-1] + 1, dtype=torch.long, pin_memory=is_gpu)
        self._host_uniforms = torch.zeros(self.widths[-1] + 1, dtype=torch.float32, pin_memory=is_gpu)
        self._device_ints = torch.zeros_like(self._host_ints, device=self.device)
        self._device_uniforms = torch.zeros_like(self._host_uniforms, device=self.device)
        self._offsets = torch.arange(self.widths[-1], device=self.device)
        # marks the end of the last copy out of the host buffers: refilling them earlier would race it
        self._inputs_copied = torch.cuda.Event() if is_gpu else None
        self._logits = self._logits_eager
        if compile:
            if is_gpu:
                for tensor in [*cache.keys, *cache.values, *cache.key_scales, *cache.value_scales]:
                    torch._dynamo.mark_static_address(tensor)
            self._logits = torch.compile(self._logits_eager, mode="reduce-overhead" if is_gpu else "default")

    def _logits_eager(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Logits [width, vocab] of tokens [1, width] at positions start + 0 .. width - 1."""
        width = tokens.shape[1]
        layout = StaticPositions(start + self._offsets[:width], self.model.inv_freq, self.cache.max_context)
        return self.model(tokens, 0, self.cache, self._offsets[:width], num_layers=self.num_layers, layout=layout)[0]

    def bucket(self, num_tokens: int, start: int) -> int:
        """The padded width of a step of num_tokens at `start`: the smallest bucket that holds it, or the
        exact width where padding would run past the cache's end."""
        width = next((width for width in self.widths if width >= num_tokens), num_tokens)
        return width if start + width <= self.cache.max_context else num_tokens

    def warm_up(self) -> None:
        """Run (and so compile) every bucket once, at position 0 of an empty cache."""
        for width in self.widths:
            self.logits([0] * width, 0)

    @torch.inference_mode()
    def logits(self, tokens: Sequence[int], start: int, uniforms: np.ndarray | None = None) -> torch.Tensor:
        """Write tokens at start .. start + len(tokens) - 1; logits [len(tokens), vocab] stay on the device."""
        width = self.bucket(len(tokens), start)
        if self._inputs_copied is not None:
            self._inputs_copied.synchronize()  # a step that read nothing back (a prompt chunk) may still be copying
        self._host_ints[:len(tokens)] = torch.as_tensor(tokens)
        self._host_ints[len(tokens):width] = 0
        self._host_ints[-1] = start
        self._device_ints.copy_(self._host_ints, non_blocking=True)
        if uniforms is not None:
            self._host_uniforms[:len(uniforms)] = torch.from_numpy(uniforms)
            self._device_uniforms.copy_(self._host_uniforms, non_blocking=True)
        if self._inputs_copied is not None:
            self._inputs_copied.record()
        logits = self._logits(self._device_ints[:width][None], self._device_ints[-1])
        return logits[:len(tokens)]

    def to_host(self, tensor: torch.Tensor) -> np.ndarray:
        """Every transfer from the device to the host goes through here (it waits for the device)."""
        self.num_host_reads += 1
        self.num_host_bytes += tensor.numel() * tensor.element_size()
        return tensor.cpu().numpy()

    @torch.inference_mode()
    def choose(self, tokens: Sequence[int], start: int, sampling: SamplingSettings,
               rng: np.random.Generator) -> tuple[int, torch.Tensor | None]:
        """Append tokens; the next token after them, with its distribution [vocab] on the device when sampling."""
        uniforms = None if sampling.is_greedy else rng.random(1)
        logits = self.logits(tokens, start, uniforms)[-1]
        token, probs = device_sampling.choose(logits, sampling, self._device_uniforms[0])
        return int(self.to_host(token.reshape(1))[0]), probs

    @torch.inference_mode()
    def verify(self, tokens: Sequence[int], start: int, draft_probs, sampling: SamplingSettings,
               rng: np.random.Generator) -> Verdict:
        """Append tokens = [pending, *draft] and verify the draft against them on the device."""
        num_draft = len(tokens) - 1
        # a point-mass (n-gram) verdict emits row draws, one per token: the stream moves by those only
        rewinds = draft_probs is None and not sampling.is_greedy
        stream_state = rng.bit_generator.state if rewinds else None
        uniforms = None if sampling.is_greedy else rng.random(num_draft + 1)
        logits = self.logits(tokens, start, uniforms)
        draft_tokens = self._device_ints[1:len(tokens)]
        if draft_probs is not None:
            draft_probs = torch.stack([torch.as_tensor(row, device=self.device) for row in draft_probs]) if num_draft else None
        verdict = device_sampling.verify(draft_tokens, draft_probs, logits, sampling,
                                         self._device_uniforms[:num_draft + 1])
        num_accepted, next_token = self.to_host(verdict).tolist()
        if rewinds:
            rng.bit_generator.state = stream_state
            rng.random(num_accepted + 1)
        return Verdict(num_accepted, next_token)
