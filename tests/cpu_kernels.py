"""Which layers this CPU can run under forced bf16 autocast, probed once per test session.

oneDNN picks its CPU kernels by instruction set. On a CPU without AVX-512 (an AVX2-only AMD
EPYC, say) torch 2.13 has no bf16 kernel for `nn.LSTM`: `torch.autocast("cpu", bfloat16)`
fails inside it with "could not create a primitive descriptor for the LSTM forward
propagation primitive". Converted scripts enable autocast on CUDA only, so only the runs
that force it on a CPU (`AUTOACCEL_FORCE_AUTOCAST=1`) meet this; such a test skips, giving
the probe's answer as its reason. The probe runs in a child process with the environment
the runs get, so `ONEDNN_MAX_CPU_ISA=AVX2` simulates an AVX2-only CPU on any other.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

# A small forward of each layer a fixture runs under forced bf16 and some CPUs cannot.
LAYER_FORWARDS = {"LSTM": "torch.nn.LSTM(8, 8)(torch.randn(5, 2, 8))"}
PROBE_TIMEOUT_S = 60

_lock = threading.Lock()
_answers: dict[tuple, str | None] = {}


def missing_bf16_kernel(layer: str, env: dict[str, str] | None = None) -> str | None:
    """Why forced bf16 autocast cannot run `torch.nn.<layer>` here, or None when it can
    (asked once per session for each layer and environment)."""
    key = (layer, tuple(sorted((env or {}).items())))
    with _lock:
        if key not in _answers:
            _answers[key] = _probe(layer, env or {})
        return _answers[key]


def _probe(layer: str, env: dict[str, str]) -> str | None:
    code = (
        "import torch\n"
        "print(torch.backends.cpu.get_cpu_capability())\n"
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        f"    {LAYER_FORWARDS[layer]}\n"
    )
    env = {**os.environ, **env}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True,
        timeout=PROBE_TIMEOUT_S,
    )  # fmt: skip
    if proc.returncode == 0:
        return None
    error = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    capability = proc.stdout.strip() or "unknown"
    return (
        f"forced bf16 autocast cannot run nn.{layer} on this CPU (torch capability"
        f" {capability}, ONEDNN_MAX_CPU_ISA={env.get('ONEDNN_MAX_CPU_ISA', 'unset')}):"
        f" {error}"
    )


def skip_without_bf16(layers: tuple[str, ...]) -> None:
    """Skip the calling test when forced bf16 autocast cannot run one of `layers` here."""
    for layer in layers:
        reason = missing_bf16_kernel(layer)
        if reason is not None:
            pytest.skip(reason)
