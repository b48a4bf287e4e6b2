"""Proof by running: fixtures/ddp/read_back_config/ converted to ddp, under
`torchrun --nproc_per_node=2` (gloo, CPU). After training rank 0 alone saves the run
(its weights, then config.json), and every rank calls sample.py's `generate()`, which
reads config.json back. Without the barrier before that call, rank 1 reads while rank 0
is still saving: FileNotFoundError (tests/test_convert_read_back.py checks the code)."""

from __future__ import annotations

import shutil

import pytest

from running import DDP_OPTIONS, FIXTURES_DIR, _check, run_autoaccel, run_ranks

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def test_every_rank_reads_the_config_rank_zero_wrote(tmp_path):
    shutil.copytree(FIXTURES_DIR / "ddp" / "read_back_config", tmp_path / "project")
    out = tmp_path / "out"
    proc = run_autoaccel(
        "convert", "project/train.py", *DDP_OPTIONS, "-o", out, "--no-verify", cwd=tmp_path
    )
    _check(proc, "autoaccel convert read_back_config")
    ranks = run_ranks(out / "train.py", [], out)
    _check(ranks, "torchrun read_back_config")
    assert ranks.stdout.count("sample: [") == 1  # rank 0 prints what every rank sampled
