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
  and the position, and one of the draws' position keys when sampling;
- the token choice and the verification run on the device (device_sampling.py), and the host
  reads back two integers. Every read from the device goes through `to_host`, which counts the
  reads and their bytes: tests/test_static_step.py checks there is one read of 16 bytes per step.

On a GPU every bucket's step is captured once in a CUDA graph (torch.cuda.CUDAGraph) and
replayed: a step then costs one launch from the host instead of a thousand. Every input sits in
a fixed device buffer and every cache write is in place, so a replay needs nothing else. The
graphs share one memory pool (each bucket's logits, and the widest one's activations: the plan's
graph_pools term, memplanner/torch_peak.py). With `compile`, the two halves of a block around
attention (Block.project and Block.finish) and the attention itself are torch.compile'd once
for all blocks (and the output head once): they take modules and tensors, never
the cache or a layer number, so one compile serves every block, Inductor fuses their
elementwise work, and compiling costs one block's graphs, not the whole model's; writing the
cache stays eager inside the graph (or, with writes_in_projection, joins the compiled projection:
project_into_cache, which the GPU suite measures against it). `compile_scope="step"` compiles the
whole step instead (the GPU suite's comparison). Buckets are captured when the backend opens, before anything is timed.
On a CPU the same code runs without graphs (compiled by Inductor or eager), which is how the
tests prove that it gives the dynamic path's tokens.

On a GPU, attention (step_attention.py) folds each key/value head's group of query heads into
query rows, so the cache is read once per key/value head rather than copied out to every
query head, and runs as two matmuls around a float32 softmax by default (grouped_attention's
docstring says why not SDPA), or as FlexAttention's decoding kernel (attention="flex").
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from memplanner.torch_sizes import bucket_widths  # one home, shared with the memory plan (graph pools)
from pocketspec.settings import SamplingSettings
from pocketspec.speculation.draws import SeededDraws
from pocketspec.torch_model import device_sampling
from pocketspec.torch_model.fused_projections import fuse_projections
from pocketspec.torch_model.kv_cache import write_positions
from pocketspec.torch_model.model import Block, masked_attention, rope_angles
from pocketspec.torch_model.step_attention import flex_grouped_attention, grouped_attention, grouped_sdpa, key_blocks
from pocketspec.speculation.verify import Verdict


COMPILE_SCOPES = ("blocks", "step")
STEP_ATTENTIONS = {"matmul": grouped_attention, "sdpa": grouped_sdpa, "flex": flex_grouped_attention}


class StaticPositions:
    """The model's `layout` for one static step: tokens at positions [T] held on the device."""

    def __init__(self, positions: torch.Tensor, inv_freq: torch.Tensor, max_context: int, attention=None,
                 uses_blocks: bool = False):
        """attention: one of step_attention's (or its compiled twin), None for the CPU's SDPA; uses_blocks:
        it takes the positions and key_blocks (flex_grouped_attention) instead of the mask."""
        self.positions, self.attention, self.uses_blocks = positions, attention, uses_blocks
        self.cos, self.sin = rope_angles(positions, inv_freq)
        if uses_blocks:
            self.blocks = key_blocks(positions, max_context)
        else:
            key_positions = torch.arange(max_context, device=positions.device)
            self.mask = key_positions[None, :] <= positions[:, None]  # [T, max_context]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, layer: int) -> torch.Tensor:
        """q [1, heads, T, head_dim] over the whole cache, after writing k and v [1, kv_heads, T, head_dim]."""
        cache.write_at(layer, self.positions, k, v)
        return self.attend_cached(q, cache, layer)

    def attend_cached(self, q: torch.Tensor, cache, layer: int) -> torch.Tensor:
        """q [1, heads, T, head_dim] over the whole cache, its keys and values already written."""
        keys, values = cache.read(layer, cache.max_context, dtype=q.dtype)
        if self.attention is None:
            return masked_attention(q, keys, values, self.mask, expand_groups=False)
        if self.uses_blocks:
            return self.attention(q, keys, values, self.positions, self.blocks)
        return self.attention(q, keys, values, self.mask)


def project_into_cache(block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                       *buffers: torch.Tensor | None) -> torch.Tensor:
    """Block.project, writing its keys and values to the layer's cache `buffers` (StaticKVCache.layer_buffers)
    at `positions`; q. Compiled, the write joins the kernel that rotates the keys."""
    q, k, v = block.project(x, cos, sin)
    write_positions(*buffers, positions, k, v)
    return q


def attention_kernels():
    """SDPA may pick flash, memory-efficient or math attention here, never cuDNN's: for a handful of
    query rows its plan costs the host 1.5 ms a call (profiled on an H200), and the static step gains
    nothing from it."""
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class StaticDecodeStep:
    def __init__(self, model, cache, *, num_layers: int, max_width: int, compile: bool = False,
                 compile_scope: str = "blocks", captures: bool | None = None, attention: str | None = None,
                 fuses: bool | None = None, writes_in_projection: bool = False):
        """captures: replay CUDA graphs (None: on a CUDA device). attention: one of STEP_ATTENTIONS
        (step_attention.py; the GPU suite compares them); None: "matmul" on a GPU, the CPU's SDPA on a CPU.
        fuses: run q/k/v and gate/up as one matmul each (fused_projections.py; None: on a CUDA device).
        writes_in_projection: write the cache inside the (compiled) projection, project_into_cache,
        rather than by two index_copy_ kernels of their own."""
        if compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope {compile_scope!r}: one of {COMPILE_SCOPES}")
        self.model, self.cache, self.num_layers = model, cache, num_layers
        self.device = model.tok_embeddings.weight.device
        self.widths = bucket_widths(max_width)
        self.num_host_reads = 0
        self.num_host_bytes = 0
        is_gpu = self.device.type == "cuda"
        self.captures = is_gpu if captures is None else captures and is_gpu
        if is_gpu if fuses is None else fuses:
            fuse_projections(model)
        # one host buffer for a step's integers: [tokens (padded), start]; one for its rows' draw keys
        self._host_ints = torch.zeros(self.widths[-1] + 1, dtype=torch.long, pin_memory=is_gpu)
        self._host_keys = torch.zeros(self.widths[-1] + 1, dtype=torch.long, pin_memory=is_gpu)
        self._device_ints = torch.zeros_like(self._host_ints, device=self.device)
        self._device_keys = torch.zeros_like(self._host_keys, device=self.device)
        self._offsets = torch.arange(self.widths[-1], device=self.device)
        # marks the end of the last copy out of the host buffers: refilling them earlier would race it
        self._inputs_copied = torch.cuda.Event() if is_gpu else None
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if self.captures else None
        self._project, self._finish, self._forward = Block.project, Block.finish, self._logits_eager
        self._project_into_cache = project_into_cache if writes_in_projection else None
        self._head = type(model).head
        attention = attention or ("matmul" if is_gpu else None)
        if attention is not None and attention not in STEP_ATTENTIONS:
            raise ValueError(f"attention {attention!r}: one of {', '.join(STEP_ATTENTIONS)}")
        self._attention = None if attention is None else STEP_ATTENTIONS[attention]
        self._uses_blocks = attention == "flex"
        if self._uses_blocks and not is_gpu:
            # torch 2.13's CPU template for FlexAttention gave wrong rows for one query token over whole blocks
            # of keys (2026-11-28): on a CPU it runs eagerly, as its reference math, whatever is compiled
            self._attention = torch.compiler.disable(self._attention)
        if compile and compile_scope == "blocks":
            self._project = torch.compile(Block.project)
            self._finish = torch.compile(Block.finish)
            self._head = torch.compile(self._head)  # the norm fused, and an int8 head through int8_reduction
            if self._attention is not None:
                self._attention = torch.compile(self._attention)
            if self._project_into_cache is not None:
                self._project_into_cache = torch.compile(project_into_cache)
        elif compile:  # the whole step; without our own graphs, Inductor's (cudagraph trees) on a GPU
            if is_gpu and not self.captures:
                for tensor in [*cache.keys, *cache.values, *cache.key_scales, *cache.value_scales]:
                    torch._dynamo.mark_static_address(tensor)
            mode = "reduce-overhead" if is_gpu and not self.captures else "default"
            self._forward = torch.compile(self._logits_eager, mode=mode)

    def _logits_eager(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Logits [width, vocab] of tokens [1, width] at positions start + 0 .. width - 1."""
        width = tokens.shape[1]
        layout = StaticPositions(start + self._offsets[:width], self.model.inv_freq, self.cache.max_context,
                                 self._attention, self._uses_blocks)
        x = self.model.embed(tokens)
        for layer, block in enumerate(self.model.layers[:self.num_layers]):
            if self._project_into_cache is not None:
                q = self._project_into_cache(block, x, layout.cos, layout.sin, layout.positions,
                                             *self.cache.layer_buffers(layer))
                attended = layout.attend_cached(q, self.cache, layer)
            else:
                q, k, v = self._project(block, x, layout.cos, layout.sin)
                attended = block.attention.attend(q, k, v, self.cache, layer, 0, layout)
            x = self._finish(block, x, attended)
        return self._head(self.model, x[0]).float()

    def _run(self, width: int) -> torch.Tensor:
        """The step of one bucket on the inputs already in the device buffers; its graph's if captured."""
        tokens, start = self._device_ints[:width][None], self._device_ints[-1]
        if not self.captures:
            with attention_kernels():
                return self._forward(tokens, start)
        if width not in self._graphs:
            self._graphs[width] = self._capture(tokens, start)
        graph, logits = self._graphs[width]
        graph.replay()
        return logits

    def _capture(self, tokens: torch.Tensor, start: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Run the step twice on a side stream (compiling, and letting libraries pick their kernels), then
        record it. The runs write the same keys and values that the replay will, so they change nothing."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), attention_kernels():
            for _ in range(2):
                self._forward(tokens, start)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool), attention_kernels():
            logits = self._forward(tokens, start)
        return graph, logits

    def bucket(self, num_tokens: int, start: int) -> int:
        """The padded width of a step of num_tokens at `start`: the smallest bucket that holds it, or the
        exact width where padding would run past the cache's end."""
        width = next((width for width in self.widths if width >= num_tokens), num_tokens)
        return width if start + width <= self.cache.max_context else num_tokens

    def warm_up(self, on_width: Callable[[int], None] = lambda num_done: None) -> None:
        """Run (and so compile and capture) every bucket once, at position 0 of an empty cache; on_width(1)
        after each."""
        for width in self.widths:
            self.logits([0] * width, 0)
            on_width(1)

    @torch.inference_mode()
    def logits(self, tokens: Sequence[int], start: int, keys: np.ndarray | None = None) -> torch.Tensor:
        """Write tokens at start .. start + len(tokens) - 1; logits [len(tokens), vocab] stay on the device."""
        width = self.bucket(len(tokens), start)
        if self._inputs_copied is not None:
            self._inputs_copied.synchronize()  # a step that read nothing back (a prompt chunk) may still be copying
        self._host_ints[:len(tokens)] = torch.as_tensor(tokens)
        self._host_ints[len(tokens):width] = 0
        self._host_ints[-1] = start
        self._device_ints.copy_(self._host_ints, non_blocking=True)
        if keys is not None:
            self._host_keys[:len(keys)] = torch.from_numpy(keys)
            self._device_keys.copy_(self._host_keys, non_blocking=True)
        if self._inputs_copied is not None:
            self._inputs_copied.record()
        return self._run(width)[:len(tokens)]

    def to_host(self, tensor: torch.Tensor) -> np.ndarray:
        """Every transfer from the device to the host goes through here (it waits for the device)."""
        self.num_host_reads += 1
        self.num_host_bytes += tensor.numel() * tensor.element_size()
        return tensor.cpu().numpy()

    @torch.inference_mode()
    def choose(self, tokens: Sequence[int], start: int, sampling: SamplingSettings, draws: SeededDraws) -> int:
        """Append tokens; the next token after them, drawn at draws' position."""
        keys = None if sampling.is_greedy else draws.keys(1)
        logits = self.logits(tokens, start, keys)[-1]
        token = device_sampling.choose(logits, sampling, self._device_keys[:1])
        return int(self.to_host(token.reshape(1))[0])

    @torch.inference_mode()
    def verify(self, tokens: Sequence[int], start: int, sampling: SamplingSettings, draws: SeededDraws) -> Verdict:
        """Append tokens = [pending, *draft] and verify the draft against them on the device, row 0's token
        drawn at draws' position."""
        num_draft = len(tokens) - 1
        keys = None if sampling.is_greedy else draws.keys(num_draft + 1)
        logits = self.logits(tokens, start, keys)
        verdict = device_sampling.verify(self._device_ints[1:len(tokens)], logits, sampling,
                                         self._device_keys[:num_draft + 1])
        num_accepted, next_token = self.to_host(verdict).tolist()
        return Verdict(num_accepted, next_token)
