"""Proof by running (issue 29): the conversions of tests/test_convert_helper_writes.py
under `torchrun --nproc_per_node=2` (gloo, CPU).

- fixtures/projects/helper_writes: a probe records the files each rank opens for writing
  or `torch.save`s; rank 1 writes none, rank 0 the helper's three.
- fixtures/ddp/trainer_epoch_average.py: rank 0 prints the original's epoch averages
  (its samples come in pairs, so the unshuffled shards hold the original's data).
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap

import pytest

from running import DDP_OPTIONS, FIXTURES_DIR, _check, convert, run_autoaccel, run_ranks, run_script

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

PROBE = textwrap.dedent("""\
    # Run the script given as the first argument; write writes-<RANK>.json: the files
    # it opened for writing or saved with torch.save.
    import builtins
    import json
    import os
    import runpy
    import sys

    import torch

    written, real_open, real_save = [], builtins.open, torch.save


    def recording_open(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wax+"):
            written.append(os.fspath(file))
        return real_open(file, mode, *args, **kwargs)


    def recording_save(obj, f, *args, **kwargs):
        written.append(os.fspath(f))
        return real_save(obj, f, *args, **kwargs)


    builtins.open, torch.save = recording_open, recording_save
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        with real_open(f"writes-{os.environ.get('RANK', 0)}.json", "w") as out:
            json.dump(sorted(set(written)), out)
    """)


def test_only_rank_zero_writes_what_the_helper_writes(tmp_path):
    shutil.copytree(FIXTURES_DIR / "projects" / "helper_writes", tmp_path / "project")
    out = tmp_path / "out"
    proc = run_autoaccel(
        "convert", "project/train.py", *DDP_OPTIONS, "-o", out, "--no-verify", cwd=tmp_path
    )
    _check(proc, "autoaccel convert helper_writes")
    (out / "probe.py").write_text(PROBE)
    _check(run_ranks(out / "probe.py", ["train.py"], out), "torchrun helper_writes")
    saved = [f"runs/regression/{name}" for name in ("history.json", "settings.json", "weights.pt")]
    assert json.loads((out / "writes-0.json").read_text()) == saved
    assert json.loads((out / "writes-1.json").read_text()) == []


def averages(output: str) -> list[float]:
    return [float(value) for value in re.findall(r"train loss ([0-9.]+)", output)]


def test_rank_zero_prints_the_original_epoch_averages(tmp_path):
    fixture = FIXTURES_DIR / "ddp" / "trainer_epoch_average.py"
    original = run_script(fixture, cwd=tmp_path)
    _check(original, "python trainer_epoch_average.py")
    converted = convert(fixture, tmp_path, *DDP_OPTIONS)
    ranks = run_ranks(converted, [], tmp_path)
    _check(ranks, "torchrun trainer_epoch_average")
    expected = averages(original.stdout)
    assert len(expected) == 3
    assert averages(ranks.stdout) == pytest.approx(expected, abs=2e-5)  # rank 0 prints, once
