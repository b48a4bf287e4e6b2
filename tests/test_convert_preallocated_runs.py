"""fixtures/ddp/preallocated_batch.py converted with `--to ddp` and its default proof, then
run on two ranks: with a batch of 2, each rank loads one row a step; before its buffers
followed the per-process batch, `input_x.copy_(x)` broadcast that row into the global
batch's two (the proof passed, each row trained twice)."""

from __future__ import annotations

import json

import pytest
from running import FIXTURES_DIR, _check, run_autoaccel, run_ranks
from test_convert_tensor_data_runs import PROBE

pytestmark = pytest.mark.runs

ARGS = ("--batch_size", "2")


def test_each_rank_trains_on_its_own_rows_once(tmp_path):
    fixture = FIXTURES_DIR / "ddp/preallocated_batch.py"
    script = tmp_path / "converted.py"
    proc = run_autoaccel("convert", fixture, "--to", "ddp", "-o", script, "--", *ARGS, cwd=tmp_path)
    _check(proc, "autoaccel convert --to ddp (proven)")
    (tmp_path / "probe.py").write_text(PROBE)
    _check(run_ranks(tmp_path / "probe.py", (script, *ARGS), tmp_path), "two ranks")
    loaded, trained = [], []
    for rank in (0, 1):
        probe = json.loads((tmp_path / f"probe-{rank}.json").read_text())
        loaded.append([round(row[0] * 100) for row in probe["samples"]])
        trained.append([round(v * 100) for step in probe["rows"] for v in step])
        assert all(len(step) == 1 for step in probe["rows"])  # one row a step, not two
    assert trained == loaded  # each rank trains on the rows it loaded, each once
    for epoch in (slice(0, 32), slice(32, 64)):
        first, second = (set(rows[epoch]) for rows in trained)
        assert len(first) == len(second) == 32 and not first & second
