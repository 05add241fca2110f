"""benchmarks/gpu_suite.py runs where a GPU machine has torch but neither gguf nor llama.cpp: a group of
the suite, in its own process as the suite starts it, with both imports refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFUSING_SITE = '''
import importlib.abc, sys
class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("gguf", "llama_cpp"):
            raise ImportError(f"{name} is not on this machine")
sys.meta_path.insert(0, _Refuse())
'''


def test_a_suite_group_runs_without_gguf_or_llama_cpp(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(REFUSING_SITE)
    group = {"model": "tiny", "weights": "int8", "variants": ["graphs", "compiled-materialized"], "bandwidth": 1e10}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"), "--child", json.dumps(group),
                           "--device", "cpu", "--context", "32", "--num-tokens", "4"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert [row["variant"] for row in rows] == group["variants"]
    assert all("error" not in row and row["tokens_per_second"] > 0 for row in rows), rows
