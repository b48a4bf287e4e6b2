"""fixtures/ddp/progress_bars.py under torchrun: rank 1 draws no progress bar and prints
nothing, rank 0 draws the original's bars. tqdm is not installed here: a stand-in
(tests/stubs/tqdm) draws one line per item on stderr, and honours `disable`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "progress_bars.py"
STUBS = Path(__file__).resolve().parent / "stubs"


def test_every_bar_is_drawn_on_rank_zero_only():
    converted = convert_source(
        FIXTURE.read_text(), ConvertOptions(target="ddp", amp="off"), str(FIXTURE)
    ).converted
    assert "    for epoch in trange(2, disable=RANK != 0):\n" in converted
    assert "        for x, y in tqdm(train, disable=RANK != 0):\n" in converted
    assert 'for x, y in tqdm(test, desc="test", disable=RANK != 0)' in converted


@pytest.mark.runs
def test_rank_one_draws_no_bar(tmp_path):
    converted = convert_source(
        FIXTURE.read_text(), ConvertOptions(target="ddp", amp="off"), str(FIXTURE)
    ).converted
    (tmp_path / "ddp.py").write_text(converted)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(STUBS)}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "--log-dir", str(tmp_path / "logs"), "--redirects", "3", "ddp.py",
    ]  # fmt: skip
    run = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    outputs = {
        path.parent.name + "/" + path.name: path.read_text()
        for path in (tmp_path / "logs").rglob("std*.log")
    }
    rank0 = "".join(
        text for name, text in outputs.items() if "/0/" in f"/{name}" or name.startswith("0/")
    )
    rank1 = "".join(text for name, text in outputs.items() if name.startswith("1/"))
    assert rank1 == "", rank1
    # 2 epochs; each 8 batches of this process's 4 samples (half of 64, by 8 // 2), 2 test batches
    assert rank0.count("bar ") == 2 + 2 * 8 + 2 * 2 and rank0.count("test error") == 2
