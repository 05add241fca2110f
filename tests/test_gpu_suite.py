"""benchmarks/gpu_suite.py on the CPU: its groups run where a GPU machine has torch but neither gguf nor
llama.cpp (both imports refused here), each in its own process as the suite starts it, and a verify group
measures the speculative loop's host side with the real engine."""

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


def _run_group(group: dict, site: Path) -> list[dict]:
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(REFUSING_SITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"),
                           "--child", json.dumps({**group, "bandwidth": 1e10}),
                           "--device", "cpu", "--context", "32", "--num-tokens", "4"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert [row["variant"] for row in rows] == group["variants"]
    assert all("error" not in row and row["tokens_per_second"] > 0 for row in rows), rows
    return rows


def test_a_compiled_int8_group_runs_without_gguf_or_llama_cpp(tmp_path):
    _run_group({"model": "tiny", "weights": "int8", "variants": ["graphs", "compiled-materialized"]}, tmp_path)


def test_a_verify_group_times_the_speculative_loop(tmp_path):
    [row] = _run_group({"model": "tiny", "weights": "fp32", "variants": ["graphs"], "verify": True}, tmp_path)
    assert set(row["verify"]["verify_ms"]) == {"0", "32"}
    for drafter in ("none", "ngram"):
        found = row["speculation"][drafter]
        assert found["num_steps"] > 0 and 0 < found["loop_ms_per_step"] < found["step_ms"]
    assert row["speculation"]["none"]["acceptance"] == 0
    sampled = row["sampled_verify"]
    assert set(sampled["ms"]["sampled"]) == set(sampled["planned_bytes"]) == {"1", "16", "32"}
    assert all(ms > 0 for name in ("greedy", "sampled") for ms in sampled["ms"][name].values())


def test_the_suite_checks_the_devices_draws_against_the_hosts():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_suite import draws_check

    assert draws_check("cpu", vocab_size=5000, rows=8) == {"uniform_rows_equal": 8, "rows": 8, "draws_equal_t1": 8,
                                                           "draws_equal_top_p": 8}
