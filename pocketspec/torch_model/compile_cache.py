"""Where torch.compile keeps what it built: POCKETSPEC_HOME/compile/torch-<version>.

Inductor caches its compiled graphs (the FX graph cache, keyed by the graph, its input
shapes and dtypes, the device and the torch version) and their Triton kernels under
TORCHINDUCTOR_CACHE_DIR. Pointing it into POCKETSPEC_HOME keeps them beside the models and
cost tables, across reboots (torch's default is under /tmp), so a second start of the same
model, dtype and buckets loads its kernels instead of compiling them. A user's own
TORCHINDUCTOR_CACHE_DIR wins.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from pocketspec.models.catalog import pocketspec_home


def use_compile_cache() -> Path:
    """Point Inductor's caches into POCKETSPEC_HOME unless the environment already names a place."""
    default = pocketspec_home() / "compile" / f"torch-{torch.__version__}"
    return Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(default)))
