"""A CPU without AVX-512, simulated on any CPU: `ONEDNN_MAX_CPU_ISA=AVX2` keeps oneDNN to
the kernels such a CPU has (and `ATEN_CPU_CAPABILITY=avx2` keeps torch's own to them).
There forced bf16 autocast cannot run `nn.LSTM`: the probe says so, the run tests skip that
run naming the reason and still prove the default conversion, and `bench` says which layer
the CPU cannot run (see cpu_kernels.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from command_runs import autoaccel
from cpu_kernels import missing_bf16_kernel
from running import FIXTURES_DIR

pytest.importorskip("torch")

AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
TESTS_DIR = Path(__file__).resolve().parent


@pytest.mark.runs
def test_probe_finds_no_bf16_lstm_on_an_avx2_cpu():
    reason = missing_bf16_kernel("LSTM", AVX2_ONLY)
    assert reason is not None
    assert "nn.LSTM" in reason and "ONEDNN_MAX_CPU_ISA=AVX2" in reason
    assert "could not create a primitive descriptor for the LSTM" in reason


@pytest.mark.runs
def test_run_tests_skip_forced_bf16_on_an_avx2_cpu_and_say_why(tmp_path):
    proc = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            f"--basetemp={tmp_path / 'inner'}", "-k", "lstm_lm",
            str(TESTS_DIR / "test_convert_runs.py"),
        ],
        cwd=TESTS_DIR.parent, env={**os.environ, **AVX2_ONLY}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "1 passed, 1 skipped" in proc.stdout
    skipped = next(line for line in proc.stdout.splitlines() if line.startswith("SKIPPED"))
    assert "forced bf16 autocast cannot run nn.LSTM on this CPU" in skipped


@pytest.mark.runs
def test_bench_names_the_layer_forced_bf16_cannot_run_on_an_avx2_cpu(tmp_path, monkeypatch):
    for name, value in {**AVX2_ONLY, "AUTOACCEL_FORCE_AUTOCAST": "1"}.items():
        monkeypatch.setenv(name, value)
    proc = autoaccel(
        "bench", FIXTURES_DIR / "lstm_lm.py", "--steps", "2", "--warmup", "1", "--repeats", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "the converted script failed" in said
    assert "[forced bf16 autocast: oneDNN has no bf16 kernel for LSTM on this CPU's" in said
