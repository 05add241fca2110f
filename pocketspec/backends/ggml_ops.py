"""Single ggml operators run through the installed llama-cpp-python's own ggml libraries (ctypes).

Used to find which CPU kernels compute a batch's rows differently from one-row calls (issue 37's
exactness table, `benchmarks/kernel_exactness.py`) and to test the row-exact kernels bit for bit.
Weights go into either the plain CPU buffer or the CPU_REPACK buffer that llama.cpp uses when it
repacks weights, so both layouts run exactly the kernels a model would.
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

KV_CELLS_PADDING = 256  # llama.cpp pads the attended cache to a multiple of 256 cells (llama-kv-cache.cpp)
GGML_PREC_F32 = 10


ROW_EXACT_SYMBOL = "ggml_cpu_row_exact_max_rows"  # exported by native/patches/row-exact-verify.patch


def installed_lib_dir() -> Path:
    """Where the installed llama-cpp-python keeps its ggml and llama libraries."""
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


def cpu_library(lib_dir: Path | None = None) -> Path:
    """ggml's CPU backend library, where the kernels (and the row-exact patch's) live: by its soname,
    the file llama.cpp's own libraries link to, so that the process holds one copy of it."""
    return (lib_dir or installed_lib_dir()) / "libggml-cpu.so.0"  # SOVERSION 0 of the pinned llama.cpp


def cpu_library_identity(lib_dir: Path | None = None) -> str:
    """Which build of ggml's CPU kernels is installed (its library file's size and modification time):
    a rebuild, with another version of the row-exact patch for one, gives another identity."""
    stat = cpu_library(lib_dir).stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}"


@functools.cache
def row_exact_max_rows(lib_dir: Path | None = None) -> int:
    """The widest verify batch whose matmul and attention rows this build computes bit for bit as
    one-row decoding does (PocketSpec's patch to ggml's CPU backend); 0 for a build without the
    patch, or with GGML_CPU_ROW_EXACT=0 in the environment (which the library reads once per process,
    so the answer is asked once too)."""
    cpu = ctypes.CDLL(str(cpu_library(lib_dir)), mode=ctypes.RTLD_GLOBAL)
    query = getattr(cpu, ROW_EXACT_SYMBOL, None)
    if query is None:
        return 0
    query.restype = ctypes.c_int
    query.argtypes = []
    return int(query())


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _declare(lib, name, restype, *argtypes):
    function = getattr(lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


class Ggml:
    """The few ggml entry points the operator runs need, bound once per process."""

    def __init__(self, lib_dir: Path | None = None):
        lib_dir = lib_dir or installed_lib_dir()
        mode = ctypes.RTLD_GLOBAL
        base = ctypes.CDLL(str(lib_dir / "libggml-base.so.0"), mode=mode)
        ctypes.CDLL(str(lib_dir / "libggml.so.0"), mode=mode)
        cpu = ctypes.CDLL(str(cpu_library(lib_dir)), mode=mode)
        p, i64, i32, size = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
        self.init = _declare(base, "ggml_init", p, _InitParams)
        self.free = _declare(base, "ggml_free", None, p)
        self.tensor_overhead = _declare(base, "ggml_tensor_overhead", size)
        self.graph_overhead = _declare(base, "ggml_graph_overhead", size)
        self.new_tensor_2d = _declare(base, "ggml_new_tensor_2d", p, p, i32, i64, i64)
        self.new_tensor_3d = _declare(base, "ggml_new_tensor_3d", p, p, i32, i64, i64, i64)
        self.new_tensor_4d = _declare(base, "ggml_new_tensor_4d", p, p, i32, i64, i64, i64, i64)
        self.nbytes = _declare(base, "ggml_nbytes", size, p)
        self.row_size = _declare(base, "ggml_row_size", size, i32, i64)
        self.quantize_chunk = _declare(base, "ggml_quantize_chunk", size, i32, p, p, i64, i64, i64, p)
        self.quantize_init = _declare(base, "ggml_quantize_init", None, i32)
        self.mul_mat = _declare(base, "ggml_mul_mat", p, p, p, p)
        self.flash_attn_ext = _declare(base, "ggml_flash_attn_ext", p, p, p, p, p, p,
                                       ctypes.c_float, ctypes.c_float, ctypes.c_float)
        self.flash_attn_ext_set_prec = _declare(base, "ggml_flash_attn_ext_set_prec", None, p, i32)
        self.new_graph = _declare(base, "ggml_new_graph", p, p)
        self.build_forward_expand = _declare(base, "ggml_build_forward_expand", None, p, p)
        self.alloc_ctx_tensors = _declare(base, "ggml_backend_alloc_ctx_tensors_from_buft", p, p, p)
        self.buffer_free = _declare(base, "ggml_backend_buffer_free", None, p)
        self.tensor_set = _declare(base, "ggml_backend_tensor_set", None, p, p, size, size)
        self.tensor_get = _declare(base, "ggml_backend_tensor_get", None, p, p, size, size)
        self.buft_name = _declare(base, "ggml_backend_buft_name", ctypes.c_char_p, p)
        self.graph_compute = _declare(base, "ggml_backend_graph_compute", i32, p, p)
        self.backend_free = _declare(base, "ggml_backend_free", None, p)
        self.reg_dev_get = _declare(base, "ggml_backend_reg_dev_get", p, p, size)
        self.reg_get_proc_address = _declare(base, "ggml_backend_reg_get_proc_address", p, p, ctypes.c_char_p)
        self.cpu_init = _declare(cpu, "ggml_backend_cpu_init", p)
        self.cpu_set_n_threads = _declare(cpu, "ggml_backend_cpu_set_n_threads", None, p, i32)
        self.cpu_buffer_type = _declare(cpu, "ggml_backend_cpu_buffer_type", p)
        self.cpu_reg = _declare(cpu, "ggml_backend_cpu_reg", p)

    def repack_buffer_type(self):
        """llama.cpp's CPU_REPACK buffer type, or None where this CPU build has none."""
        reg = self.cpu_reg()
        address = self.reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        if not address:
            return None
        get_extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
        extra = get_extra(self.reg_dev_get(reg, 0))
        index = 0
        while extra and extra[index]:
            if self.buft_name(extra[index]) == b"CPU_REPACK":
                return extra[index]
            index += 1
        return None


@functools.cache
def ggml() -> Ggml:
    return Ggml()


def type_id(name: str) -> int:
    return int(GGMLQuantizationType[name.upper()])


def _encode(name: str, rows: np.ndarray) -> np.ndarray:
    """rows [n, k] float32 as the bytes ggml stores for type `name` (quantized or converted)."""
    lib = ggml()
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if name == "f32":
        return rows.view(np.uint8).reshape(-1)
    if name == "f16":
        return rows.astype(np.float16).view(np.uint8).reshape(-1)
    if name == "bf16":
        return (rows.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(-1)
    kind = type_id(name)
    lib.quantize_init(kind)
    out = np.empty(lib.row_size(kind, rows.shape[1]) * rows.shape[0], dtype=np.uint8)
    lib.quantize_chunk(kind, rows.ctypes.data, out.ctypes.data, 0, rows.shape[0], rows.shape[1], None)
    return out


class _Graph:
    """One ggml context of tensors, allocated in buffers after the graph is built, freed on exit."""

    def __init__(self, tensors: int = 16):
        lib = self.lib = ggml()
        self.ctx = lib.init(_InitParams(lib.tensor_overhead() * tensors + lib.graph_overhead(), None, True))
        self.weights_ctx = lib.init(_InitParams(lib.tensor_overhead() * 4, None, True))
        self.buffers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for buffer in self.buffers:
            self.lib.buffer_free(buffer)
        self.lib.free(self.ctx)
        self.lib.free(self.weights_ctx)

    def compute(self, result, inputs: dict, weights: dict, repack: bool, threads: int) -> np.ndarray:
        """Allocates weights (in CPU_REPACK when repack), inputs and ops, sets the data, runs the graph."""
        lib = self.lib
        graph = lib.new_graph(self.ctx)
        lib.build_forward_expand(graph, result)
        if weights:
            buft = lib.repack_buffer_type() if repack else lib.cpu_buffer_type()
            if buft is None:
                raise RuntimeError("this llama.cpp build has no CPU_REPACK buffer type")
            self.buffers.append(lib.alloc_ctx_tensors(self.weights_ctx, buft))
        self.buffers.append(lib.alloc_ctx_tensors(self.ctx, lib.cpu_buffer_type()))
        for tensor, data in {**weights, **inputs}.items():
            lib.tensor_set(tensor, data.ctypes.data, 0, data.nbytes)
        backend = lib.cpu_init()
        try:
            lib.cpu_set_n_threads(backend, threads)
            if lib.graph_compute(backend, graph) != 0:
                raise RuntimeError("ggml graph compute failed")
        finally:
            lib.backend_free(backend)
        out = np.empty(lib.nbytes(result) // 4, dtype=np.float32)
        lib.tensor_get(result, out.ctypes.data, 0, out.nbytes)
        return out


def matmul(weight_type: str, weights: np.ndarray, activations: np.ndarray, repack: bool = False,
           threads: int = 2) -> np.ndarray:
    """activations [w, k] times weights [n, k] stored as weight_type: [w, n], through ggml_mul_mat."""
    n, k = weights.shape
    width = activations.shape[0]
    with _Graph() as graph:
        lib = graph.lib
        weight = lib.new_tensor_2d(graph.weights_ctx, type_id(weight_type), k, n)
        rows = lib.new_tensor_2d(graph.ctx, type_id("f32"), k, width)
        result = lib.mul_mat(graph.ctx, weight, rows)
        out = graph.compute(result, {rows: np.ascontiguousarray(activations, dtype=np.float32)},
                            {weight: _encode(weight_type, weights)}, repack, threads)
    return out.reshape(width, n)


def attention(kv_type: str, queries: np.ndarray, keys: np.ndarray, values: np.ndarray, first_position: int,
              threads: int = 2) -> np.ndarray:
    """Flash attention as llama.cpp runs it for a batch of queries [w, heads, d] at positions
    first_position.. over a cache keys/values [cells, kv_heads, d] stored as kv_type, with the causal
    mask and the cache padded to whole 256-cell pages: [w, heads, d]."""
    width, heads, head_dim = queries.shape
    cells, kv_heads, _ = keys.shape
    attended = min(cells, max(KV_CELLS_PADDING, math.ceil((first_position + width) / KV_CELLS_PADDING)
                              * KV_CELLS_PADDING))
    mask = np.full((width, attended), -np.inf, dtype=np.float32)
    for row in range(width):
        mask[row, :first_position + row + 1] = 0.0
    with _Graph() as graph:
        lib = graph.lib
        q = lib.new_tensor_3d(graph.ctx, type_id("f32"), head_dim, width, heads)
        k = lib.new_tensor_3d(graph.ctx, type_id(kv_type), head_dim, attended, kv_heads)
        v = lib.new_tensor_3d(graph.ctx, type_id(kv_type), head_dim, attended, kv_heads)
        m = lib.new_tensor_2d(graph.ctx, type_id("f16"), attended, width)
        result = lib.flash_attn_ext(graph.ctx, q, k, v, m, 1.0 / math.sqrt(head_dim), 0.0, 0.0)
        lib.flash_attn_ext_set_prec(result, GGML_PREC_F32)

        def heads_major(cache):
            return np.ascontiguousarray(cache[:attended].transpose(1, 0, 2)).reshape(kv_heads * attended, head_dim)

        inputs = {q: np.ascontiguousarray(queries.transpose(1, 0, 2), dtype=np.float32),
                  k: _encode(kv_type, heads_major(keys)), v: _encode(kv_type, heads_major(values)),
                  m: mask.astype(np.float16)}
        out = graph.compute(result, inputs, {}, False, threads)
    return out.reshape(width, heads, head_dim)


def matmul_exact_widths(weight_type: str, repack: bool = False, max_width: int = 32, rows: int = 256,
                        columns: int = 1536, seed: int = 0, threads: int = 2) -> list[bool]:
    """For w = 1..max_width: whether a batch of w activation rows gives, in every row, exactly the bits
    of that row multiplied alone (random weights of shape [rows, columns] stored as weight_type)."""
    generator = np.random.default_rng(seed)
    weights = (generator.standard_normal((rows, columns)) * 0.02).astype(np.float32)
    activations = generator.standard_normal((max_width, columns)).astype(np.float32)
    alone = np.stack([matmul(weight_type, weights, activations[row:row + 1], repack, threads)[0]
                      for row in range(max_width)])
    return [np.array_equal(matmul(weight_type, weights, activations[:width], repack, threads), alone[:width])
            for width in range(1, max_width + 1)]


def attention_exact_widths(kv_type: str, depth: int, max_width: int = 32, heads: int = 12, kv_heads: int = 2,
                           head_dim: int = 128, seed: int = 0, threads: int = 2) -> list[bool]:
    """For w = 1..max_width: whether a batch of w queries after `depth` cached tokens attends, in every row,
    exactly as that query alone at its position (a cache of kv_type, random contents)."""
    generator = np.random.default_rng(seed)
    cells = math.ceil((depth + max_width) / KV_CELLS_PADDING) * KV_CELLS_PADDING  # as llama.cpp sizes a cache
    keys = generator.standard_normal((cells, kv_heads, head_dim)).astype(np.float32)
    values = generator.standard_normal((cells, kv_heads, head_dim)).astype(np.float32)
    queries = generator.standard_normal((max_width, heads, head_dim)).astype(np.float32)
    alone = np.stack([attention(kv_type, queries[row:row + 1], keys, values, depth + row, threads)[0]
                      for row in range(max_width)])
    return [np.array_equal(attention(kv_type, queries[:width], keys, values, depth, threads), alone[:width])
            for width in range(1, max_width + 1)]


def describe_widths(exact: list[bool]) -> str:
    """'1-32', '1-7', '1, 3-5': the widths (1-based) that were exact."""
    runs, start = [], None
    for width, is_exact in enumerate([*exact, False], start=1):
        if is_exact and start is None:
            start = width
        elif not is_exact and start is not None:
            runs.append(f"{start}" if start == width - 1 else f"{start}-{width - 1}")
            start = None
    return ", ".join(runs) or "none"
