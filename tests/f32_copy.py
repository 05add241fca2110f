"""Writing an F32 copy of a real GGUF (every tensor dequantized), so llama.cpp and torch can be
compared on a real model without llama.cpp's quantized-activation dot products in the way."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_f32_copy(source: Path, destination: Path) -> Path:
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(destination), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        sub_type = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, array.reshape([int(n) for n in reversed(tensor.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return destination
