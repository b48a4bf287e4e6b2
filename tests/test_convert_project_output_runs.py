"""Proof by running (S2 of bench 31): fixtures/ddp/project_progress converted with `--to
ddp` (tests/test_convert_project_output.py) under `torchrun --nproc_per_node=2` (gloo,
CPU). A probe sends each rank's `sys.stdout` to `stdout-<RANK>.txt`: rank 0's holds the
progress bar and the logger's lines, rank 1's none.
"""

from __future__ import annotations

import shutil
import textwrap

import pytest

from running import DDP_OPTIONS, FIXTURES_DIR, _check, run_autoaccel, run_ranks

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

PROBE = textwrap.dedent("""\
    # Run the script given as the first argument with its stdout in stdout-<RANK>.txt.
    import os
    import runpy
    import sys

    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    with open(f"stdout-{os.environ.get('RANK', 0)}.txt", "w") as sys.stdout:
        runpy.run_path(script, run_name="__main__")
    """)


def test_only_rank_zero_draws_the_bar_and_logs(tmp_path):
    shutil.copytree(FIXTURES_DIR / "ddp" / "project_progress", tmp_path / "project")
    out = tmp_path / "out"
    proc = run_autoaccel(
        "convert", "project/train.py", *DDP_OPTIONS, "-o", out, "--no-verify", cwd=tmp_path
    )
    _check(proc, "autoaccel convert project_progress")
    (out / "probe.py").write_text(PROBE)
    _check(run_ranks(out / "probe.py", ["train.py"], out), "torchrun project_progress")
    rank0, rank1 = ((out / f"stdout-{rank}.txt").read_text() for rank in (0, 1))
    # 64 samples, 32 per process in batches of 4: 8 steps an epoch, 2 epochs
    assert rank0.count("bar [") == 16 and "bar [8/8]" in rank0
    assert rank0.count("log epoch ") == 2
    assert "bar [" not in rank1 and "log epoch" not in rank1
