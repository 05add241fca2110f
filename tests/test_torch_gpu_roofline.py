"""benchmarks/torch_gpu_roofline.py: its random models are built without a float32 copy on the way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# In a fresh process: reset the peak RSS (clear_refs 5), build a bf16 model of about 66 MB on the CPU,
# then print the peak above the RSS before it and the model's bytes.
MEASURE = """
import sys
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import torch
import torch_gpu_roofline as roofline
from pocketspec.stats import vm_hwm_bytes
import psutil

config = roofline.ModelConfig("llama", 4, 512, 8, 8, 64, 2048, 32000, 10000.0, 1e-5, False, True)
before = psutil.Process().memory_info().rss
open("/proc/self/clear_refs", "w").write("5")
model = roofline.random_model(config, "bf16", torch.device("cpu"))
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
assert all(p.dtype == torch.bfloat16 for p in model.parameters())
print(vm_hwm_bytes("self") - before, model_bytes)
"""


def test_a_bf16_random_model_peaks_at_its_own_size():
    """Materialising fp32 and then casting peaked at three times the bf16 model (fp32 + bf16 copies)."""
    found = subprocess.run([sys.executable, "-c", MEASURE, str(ROOT)], capture_output=True, text=True, timeout=300,
                           cwd=ROOT)
    assert found.returncode == 0, found.stderr
    peak_bytes, model_bytes = map(int, found.stdout.split())
    assert model_bytes > 60 * 2**20
    assert peak_bytes < 1.5 * model_bytes, (peak_bytes, model_bytes)
