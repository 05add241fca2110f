"""Exporting a GGUF to ONNX once, and finding the export again: POCKETSPEC_HOME/onnx/<key>/.

The key is the GGUF's sha256, the weight format, this graph's layout version and the exporter's
versions (torch, onnxscript; onnxruntime's quantizer for int4), so a new GGUF or exporter exports
again, and the older export of the same GGUF and format is removed once the new one is in place.
The export is written into a hidden folder and renamed into place whole: Ctrl-C leaves
nothing under the final name. Its manifest records each file's size and sha256; a file whose
size or mtime no longer matches is hashed again, and a mismatch (a corrupt or replaced file)
exports again. The manifest also holds what the backend needs to know of the model (its cache
shapes, RoPE base), so running an export needs neither torch nor the GGUF's weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from memplanner.onnx_sizes import INT4_BLOCK_SIZE, ONNX_FORMATS
from pocketspec.atomic_file import replaced_on_success
from pocketspec.errors import UserError
from pocketspec.file_digest import hash_file, stamp_text, stamped_sha256
from pocketspec.measured_cache import measuring_alone
from pocketspec.models.catalog import pocketspec_home
from pocketspec.onnx_model.io_names import LOGITS, LOGITS_ROWS, TOKENS, new_name, past_names
from pocketspec.progress import elapsed_seconds, progress_bar

GRAPH_VERSION = 3  # bump when pocketspec/onnx_model/graph.py changes what it computes or its names
MODEL_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"
EXAMPLE_CACHED = 7  # cached positions in the example inputs; a dynamic axis in the graph

Notify = Callable[[str], None]


@dataclass(frozen=True)
class ExportedModel:
    folder: Path
    config: dict  # num_layers, num_kv_heads, head_dim, vocab_size, rope_base, cache_dtype
    weights_format: str

    @property
    def model_file(self) -> Path:
        return self.folder / MODEL_FILE

    @property
    def num_bytes(self) -> int:
        """Bytes of the graph and its weights on disk."""
        return sum(path.stat().st_size for path in self.folder.iterdir() if path.name != MANIFEST_FILE)


def exporter_versions(weights_format: str) -> dict[str, str]:
    names = ["torch", "onnxscript", "onnx"] + (["onnxruntime"] if weights_format == "int4" else [])
    return {name: importlib.metadata.version(name) for name in names}


def gguf_sha256(path: Path, notify: Notify | None = None) -> str:
    """The GGUF's sha256: from its pull stamp (`<file>.sha256`) or this home's note of an earlier hash
    (`digests/`, for a GGUF pulled by other means) when that still matches the file's size and mtime,
    else hashed now and noted."""
    note = _digest_note(path)
    for stamp in (path.with_name(path.name + ".sha256"), note):
        known = stamped_sha256(path, stamp)
        if known is not None:
            return known
    digest = hash_file(path, progress=notify is not None)
    with contextlib.suppress(OSError, UserError):  # a home that cannot be written hashes again next time
        note.parent.mkdir(parents=True, exist_ok=True)
        with replaced_on_success(note, what="the GGUF's digest note") as file:
            file.write(stamp_text(path, digest))
    return digest


def _digest_note(path: Path) -> Path:
    """Where this home notes the sha256 of the GGUF at `path` (named by a hash of its resolved path)."""
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return pocketspec_home() / "digests" / f"{name}.sha256"


def export_folder(gguf_path: Path, weights_format: str, notify: Notify | None = None) -> Path:
    versions = "-".join(f"{name}{version}" for name, version in exporter_versions(weights_format).items())
    key = f"{gguf_sha256(gguf_path, notify)[:16]}-{weights_format}-g{GRAPH_VERSION}-{versions}"
    return pocketspec_home() / "onnx" / key


def read_intact(folder: Path) -> ExportedModel | None:
    """The export in `folder`, or None when it is missing, incomplete or any file fails its hash."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        for name, stamp in manifest["files"].items():
            path = folder / name
            stat = path.stat()
            if stat.st_size != stamp["size"]:
                return None
            if stat.st_mtime_ns != stamp["mtime_ns"] and hash_file(path, progress=False) != stamp["sha256"]:
                return None
        return ExportedModel(folder, _checked_config(manifest["config"]), manifest["weights_format"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


CONFIG_COUNTS = ("num_layers", "num_kv_heads", "head_dim", "vocab_size")
CACHE_DTYPES = ("float16", "float32")


def _checked_config(config: dict) -> dict:
    """The manifest's model config (what _export_into returned), or ValueError for one it could not have
    written (an older layout, or a hand edit): such an export is exported again, as a corrupt file is."""
    counts_ok = all(type(config[name]) is int and config[name] > 0 for name in CONFIG_COUNTS)
    rope_ok = type(config["rope_base"]) in (int, float) and 0 < config["rope_base"] < float("inf")
    if not (counts_ok and rope_ok and config["cache_dtype"] in CACHE_DTYPES):
        raise ValueError(f"not an export's model config: {config!r}")
    return config


def check_onnx_weights(weights_format: str) -> None:
    """Refuse a --weights (resolved: memplanner.onnx_sizes.resolve_onnx_format) that no export is made in: bf16 and
    int8 are torch's."""
    if weights_format not in ONNX_FORMATS:
        raise UserError(f"--backend onnx takes --weights {', '.join(ONNX_FORMATS)} or auto, not {weights_format}")


def exported_model(gguf_path: Path, weights_format: str, notify: Notify | None = None) -> ExportedModel:
    """The export of `gguf_path` in `weights_format`, exported now when there is no intact one.
    notify(line): told what the export is doing (it takes about a minute for a 135M model)."""
    check_onnx_weights(weights_format)
    folder = export_folder(gguf_path, weights_format, notify)
    found = read_intact(folder)
    if found is not None:
        return found
    with measuring_alone():  # one export at a time, and none while another process times forwards
        found = read_intact(folder)  # another process may have exported it while this one waited
        if found is not None:
            return found
        _export(folder, gguf_path, weights_format, notify)
    found = read_intact(folder)
    if found is None:
        raise UserError(f"the ONNX export in {folder} did not verify after writing; is the disk full?")
    return found


def _export(folder: Path, gguf_path: Path, weights_format: str, notify: Notify | None) -> None:
    """Export into a hidden folder beside `folder`, then rename it into place whole; notify: a watching terminal's
    lines (None: quiet)."""
    say = notify or (lambda line: None)
    if folder.exists():
        say(f"the ONNX export in {folder} is incomplete or corrupt; exporting again")
    # Under the home's measuring lock no other export runs: a hidden folder left here is a killed one's
    # (SIGKILL, out of memory, a power cut), up to the size of a model.
    for leftover in folder.parent.glob(".*.partial"):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        _remove(folder)  # before the minute of exporting, so that what cannot be removed is said first
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    except OSError as error:
        raise UserError(f"cannot write the ONNX export to {folder.parent}: {error.strerror or error}") from None
    try:
        config = _export_into(partial, gguf_path, weights_format, say, shows_time=notify is not None)
        _write_manifest(partial, gguf_path, weights_format, config)
        os.replace(partial, folder)
    except OSError as error:  # a full disk under POCKETSPEC_HOME: the export's to say, not "the output"
        raise UserError(f"cannot write the ONNX export to {folder.parent}: {error.strerror or error}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    gguf_key, weights_format_key = folder.name.split("-")[:2]
    for stale in folder.parent.glob(f"{gguf_key}-{weights_format_key}-*"):  # the same model by an older exporter
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)


def _remove(folder: Path) -> None:
    """The corrupt export in `folder`, or whatever took its name in the home's cache (a file, a link)."""
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)
    else:
        folder.unlink(missing_ok=True)


def _export_into(folder: Path, gguf_path: Path, weights_format: str, say: Notify, *, shows_time: bool) -> dict:
    """Write MODEL_FILE and its weights into `folder`; the model's config as the manifest holds it. shows_time:
    the steps that report nothing until they end count their seconds on stderr."""
    say(f"exporting {gguf_path.name} to ONNX ({weights_format}), once; cached in {folder.parent}")
    say("  [1/3] loading the weights")
    import torch

    from pocketspec.onnx_model.graph import CacheStep
    from pocketspec.torch_model.load import load_model

    model = load_model(gguf_path, "fp16" if weights_format == "fp16" else "fp32", torch.device("cpu"))
    config = model.config
    cache_dtype = model.tok_embeddings.weight.dtype
    step = CacheStep(model).eval()
    names = past_names(config.num_layers)
    pasts = tuple(torch.zeros(EXAMPLE_CACHED, config.num_kv_heads, config.head_dim, dtype=cache_dtype) for _ in names)
    example = (torch.tensor([[1, 2, 3]]), torch.tensor([0, 2]), pasts)
    Dim = torch.export.Dim
    num_cached = Dim("num_cached", min=0, max=1 << 20)
    dynamic_shapes = ({1: Dim("num_tokens", min=1, max=1 << 16)}, {0: Dim("num_rows", min=0, max=1 << 16)},
                      tuple({0: num_cached} for _ in names))
    with elapsed_seconds(shows_time, "  [2/3] tracing and translating the graph"), _quiet_exporter(), \
            torch.no_grad():
        torch.onnx.export(step, example, str(folder / MODEL_FILE), dynamo=True, dynamic_shapes=dynamic_shapes,
                          input_names=[TOKENS, LOGITS_ROWS, *names],
                          output_names=[LOGITS, *map(new_name, names)],
                          external_data=True, optimize=False, verbose=False)
    del step, model
    if weights_format == "int4":
        _quantize_int4(folder, shows_bar=shows_time)
    else:
        say("  [3/3] written")
    return {"num_layers": config.num_layers, "num_kv_heads": config.num_kv_heads, "head_dim": config.head_dim,
            "vocab_size": config.vocab_size, "rope_base": config.rope_base,
            "cache_dtype": "float16" if cache_dtype == torch.float16 else "float32"}


def _quantize_int4(folder: Path, *, shows_bar: bool) -> None:
    """Rewrite every weight MatMul as ONNX Runtime's MatMulNBits (4 bits, blocks of 32, symmetric); shows_bar:
    a bar over the MatMuls on stderr (the quantizer reports nothing itself), then the seconds of writing."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(folder / MODEL_FILE))
    for path in list(folder.iterdir()):
        path.unlink()  # everything is in memory now; the quantized model takes the same names
    # accuracy_level 4: int8 activations in the matmul, the level ONNX Runtime's CPU kernels are fastest at
    quantizer = MatMulNBitsQuantizer(model, block_size=INT4_BLOCK_SIZE, is_symmetric=True, accuracy_level=4)
    op_types = quantizer.algo_config.op_types_to_quantize
    num_matmuls = sum(node.op_type in op_types for node in model.graph.node)
    with progress_bar(shows_bar, num_matmuls, "  [3/3] quantizing the weights to int4 (MatMulNBits)") as update:
        quantize_node = quantizer.node_quantizer.quantize

        def quantize_and_count(node, graph_stack):
            quantized = quantize_node(node, graph_stack)
            update(1)
            return quantized

        quantizer.node_quantizer.quantize = quantize_and_count
        with _quiet_exporter():
            quantizer.process()
    with elapsed_seconds(shows_bar, "        writing the quantized model"):
        quantizer.model.save_model_to_file(str(folder / MODEL_FILE), use_external_data_format=True)


@contextlib.contextmanager
def _quiet_exporter():
    """The exporter and the quantizer log each step to the console; the user hears our three lines instead."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxruntime", "onnxscript")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _write_manifest(folder: Path, gguf_path: Path, weights_format: str, config: dict) -> None:
    files = {}
    for path in sorted(folder.iterdir()):
        stat = path.stat()
        files[path.name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                            "sha256": hash_file(path, progress=False)}
    manifest = {"gguf": str(gguf_path), "weights_format": weights_format, "graph_version": GRAPH_VERSION,
                "exporter": exporter_versions(weights_format), "config": config, "files": files}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
