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

On a GPU every bucket's step is captured once in a CUDA graph (torch.cuda.CUDAGraph) and
replayed: a step then costs one launch from the host instead of a thousand. Every input sits in
a fixed device buffer and every cache write is in place, so a replay needs nothing else. The
graphs share one memory pool (each bucket's logits, and the widest one's activations: the plan's
graph_pools term, memplanner/torch_peak.py). With `compile`, the two halves of a block around
attention (Block.project and Block.finish) and the attention itself are torch.compile'd once
for all blocks (and the output head once): they take modules and tensors, never
the cache or a layer number, so one compile serves every block, Inductor fuses their
elementwise work, and compiling costs one block's graphs, not the whole model's; writing the
cache stays eager inside the graph. `compile_scope="step"` compiles the whole step instead (the
GPU suite's comparison). Buckets are captured when the backend opens, before anything is timed.
On a CPU the same code runs without graphs (compiled by Inductor or eager), which is how the
tests prove that it gives the dynamic path's tokens.

On a GPU, attention (grouped_attention) folds each key/value head's group of query heads into
query rows, so the cache is read once per key/value head rather than copied out to every
query head, and runs as two matmuls around a float32 softmax (its docstring says why not SDPA).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from memplanner.torch_sizes import bucket_widths  # one home, shared with the memory plan (graph pools)
from pocketspec.settings import SamplingSettings
from pocketspec.torch_model import device_sampling
from pocketspec.torch_model.fused_projections import fuse_projections
from pocketspec.torch_model.model import Block, masked_attention, rope_angles
from pocketspec.speculation.verify import Verdict


COMPILE_SCOPES = ("blocks", "step")


def fold_query_heads(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [batch, heads, T, head_dim] as [batch, kv_heads, group x T, head_dim]: the query heads of each
    key/value head as extra rows (query head h reads key/value head h // group, repeat_interleave's order)."""
    batch, num_heads, num_tokens, head_dim = q.shape
    return q.reshape(batch, num_kv_heads, num_heads // num_kv_heads * num_tokens, head_dim)


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [batch, heads, T, head_dim] over keys and values [batch, kv_heads, max_context, head_dim], its
    query heads folded into rows (fold_query_heads), as two matmuls and a float32 softmax.

    Not SDPA: its kernels split the work by (head, block of queries), so a decode step of 2 to 8
    key/value heads ran on as many thread blocks, each walking the whole cache alone: 0.1 ms a layer
    on an H200 whatever the model, 4 ms a step. A matmul over the keys spreads over them instead."""
    folded = fold_query_heads(q, keys.shape[1])
    scores = torch.matmul(folded, keys.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask.repeat(folded.shape[2] // q.shape[2], 1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)
    return out.reshape(q.shape)


def grouped_sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """grouped_attention's folded query rows through SDPA (measured on an H200: 0.1 ms a layer)."""
    folded = fold_query_heads(q, keys.shape[1])
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask.repeat(folded.shape[2] // q.shape[2], 1))
    return out.reshape(q.shape)


class StaticPositions:
    """The model's `layout` for one static step: tokens at positions [T] held on the device."""

    def __init__(self, positions: torch.Tensor, inv_freq: torch.Tensor, max_context: int,
                 attention=grouped_attention):
        """attention: grouped_attention, or its compiled twin (a GPU's)."""
        self.positions, self.attention = positions, attention
        self.cos, self.sin = rope_angles(positions, inv_freq)
        key_positions = torch.arange(max_context, device=positions.device)
        self.mask = key_positions[None, :] <= positions[:, None]  # [T, max_context]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, layer: int) -> torch.Tensor:
        """q [1, heads, T, head_dim] over the whole cache, after writing k and v [1, kv_heads, T, head_dim]."""
        cache.write_at(layer, self.positions, k, v)
        keys, values = cache.read(layer, cache.max_context, dtype=q.dtype)
        if q.device.type == "cpu":
            return masked_attention(q, keys, values, self.mask, expand_groups=False)
        return self.attention(q, keys, values, self.mask)


def attention_kernels():
    """SDPA may pick flash, memory-efficient or math attention here, never cuDNN's: for a handful of
    query rows its plan costs the host 1.5 ms a call (profiled on an H200), and the static step gains
    nothing from it."""
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class StaticDecodeStep:
    def __init__(self, model, cache, *, num_layers: int, max_width: int, compile: bool = False,
                 compile_scope: str = "blocks", captures: bool | None = None, gpu_attention: str = "matmul",
                 fuses: bool | None = None):
        """captures: replay CUDA graphs (None: on a CUDA device). gpu_attention: "matmul"
        (grouped_attention) or "sdpa" (the same folded query rows through SDPA; the GPU suite compares).
        fuses: run q/k/v and gate/up as one matmul each (fused_projections.py; None: on a CUDA device)."""
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
        # one host buffer for a step's integers: [tokens (padded), start]; one for its uniforms
        self._host_ints = torch.zeros(self.widths[-1] + 1, dtype=torch.long, pin_memory=is_gpu)
        self._host_uniforms = torch.zeros(self.widths[-1] + 1, dtype=torch.float32, pin_memory=is_gpu)
        self._device_ints = torch.zeros_like(self._host_ints, device=self.device)
        self._device_uniforms = torch.zeros_like(self._host_uniforms, device=self.device)
        self._offsets = torch.arange(self.widths[-1], device=self.device)
        # marks the end of the last copy out of the host buffers: refilling them earlier would race it
        self._inputs_copied = torch.cuda.Event() if is_gpu else None
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if self.captures else None
        self._project, self._finish, self._forward = Block.project, Block.finish, self._logits_eager
        self._head = type(model).head
        self._attention = grouped_attention if gpu_attention == "matmul" else grouped_sdpa
        if compile and compile_scope == "blocks":
            self._project = torch.compile(Block.project)
            self._finish = torch.compile(Block.finish)
            self._head = torch.compile(self._head)  # the norm fused, and an int8 head through int8_reduction
            self._attention = torch.compile(self._attention)
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
                                 self._attention)
        x = self.model.embed(tokens)
        for layer, block in enumerate(self.model.layers[:self.num_layers]):
            q, k, v = self._project(block, x, layout.cos, layout.sin)
            x = self._finish(block, x, block.attention.attend(q, k, v, self.cache, layer, 0, layout))
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
        return self._run(width)[:len(tokens)]

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
