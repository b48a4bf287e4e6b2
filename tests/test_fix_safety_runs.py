"""Fixes that must not change what trains, proven by running a tiny script before and
after `lint --fix` (with and without `--unsafe-fixes`) and `convert`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.runs

# Dreambooth's prior preservation: `loss = loss + w * prior_loss` sums two terms of
# one step (the instance loss is defined in branches, as in diffusers' scripts), and
# `running += loss` accumulates across steps for the log.
PRIOR_PRESERVATION = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(5)]
use_prior, weighted = True, False
running = 0.0
for x, y in batches:
    optimizer.zero_grad()
    pred = model(x)
    if use_prior:
        pred, pred_prior = pred.chunk(2)
        y, y_prior = y.chunk(2)
        prior_loss = F.mse_loss(pred_prior, y_prior)
    if weighted:
        loss = (F.mse_loss(pred, y, reduction="none") * 2).mean()
    else:
        loss = F.mse_loss(pred, y)
    if use_prior:
        loss = loss + 0.5 * prior_loss
    loss.backward()
    optimizer.step()
    running += loss
print(repr(running.item()))
print(model.weight.tolist(), model.bias.tolist())
"""


def _run(*command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *command], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _trained(script: Path) -> str:
    """What the script prints: the logged loss sum and the trained parameters."""
    result = _run(str(script), cwd=script.parent)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def trained_before(tmp_path_factory) -> str:
    """What the original prints: the same for every rewrite (it seeds torch), so run once."""
    script = tmp_path_factory.mktemp("original") / "dreambooth.py"
    script.write_text(PRIOR_PRESERVATION)
    return _trained(script)


@pytest.mark.parametrize(
    "rewrite",
    [
        pytest.param(["lint", "--fix"], id="lint-fix"),
        pytest.param(["lint", "--fix", "--unsafe-fixes"], id="lint-unsafe-fixes"),
        pytest.param(["convert", "--write"], id="convert"),
    ],
)
def test_prior_preservation_trains_the_same_after_rewriting(tmp_path, rewrite, trained_before):
    script = tmp_path / "dreambooth.py"
    script.write_text(PRIOR_PRESERVATION)
    result = _run("-m", "autoaccel", *rewrite, str(script), cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    rewritten = script.read_text()
    assert "loss = loss + 0.5 * prior_loss\n" in rewritten
    assert _trained(script) == trained_before
    unsafe = "--unsafe-fixes" in rewrite
    # Only the accumulation across steps is reported, and only --unsafe-fixes fixes it.
    assert ("running += loss.detach()" in rewritten) is unsafe
