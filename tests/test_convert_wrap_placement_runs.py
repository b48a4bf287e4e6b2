"""Where the DDP wrapper (or FSDP sharding) goes, proven by running the results on two
processes (gloo, CPU): fixtures/ddp/placeholder_model.py (the model built in
`build_model()` after a `None` placeholder) and fixtures/ddp/frozen_encoder.py (a frozen
encoder, which DDP refuses, before a decoder that trains); and
fixtures/fsdp/trainer_one_statement.py (a model made after the per-process re-seed), and
fixtures/fsdp/zero_grad_after_forward.py (`model.zero_grad()` after the forward pass).

Each conversion runs under torchrun through the harness, whose record holds each rank's
parameter digest per optimizer: both ranks must finish, hold the same parameters, and
(unshuffled data, no dropout, mean losses: two halves of a batch average to the whole
batch's gradient) the original's final parameters.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from running import FIXTURES_DIR, _check, convert, run_ranks, run_under_harness

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

PROBE = textwrap.dedent("""\
    import sys
    from autoaccel.run import harness
    sys.exit(harness.main(["--losses-out", "record-{rank}.json", *sys.argv[1:]]))
    """)


@pytest.mark.parametrize(
    "name, target",
    [
        ("ddp/placeholder_model.py", "ddp"),
        ("ddp/placeholder_model.py", "fsdp"),
        ("ddp/frozen_encoder.py", "ddp"),
        ("ddp/frozen_encoder.py", "fsdp"),
        # zero_grad() between forward and backward would clear the gathered parameters'
        # gradients, not the shards': moved above the forward pass
        ("fsdp/zero_grad_after_forward.py", "fsdp"),
    ],
)
def test_converted_trains_like_the_original_on_two_ranks(tmp_path, name, target):
    fixture = FIXTURES_DIR / name
    out = convert(fixture, tmp_path, "--to", target, "--amp", "off")
    original = run_under_harness(fixture, [], tmp_path)
    assert original.returncode == 0, original.stderr
    (tmp_path / "probe.py").write_text(PROBE)
    ranks = run_ranks(tmp_path / "probe.py", (out,), tmp_path)
    _check(ranks, f"torchrun {out.name}")
    records = [json.loads((tmp_path / f"record-{rank}.json").read_text()) for rank in range(2)]
    assert [r["exit"] for r in records] == ["ok", "ok"]
    first, second = (r["param_digest"][0] for r in records)  # the first optimizer's
    assert first == pytest.approx(second, rel=1e-9)
    assert first == pytest.approx(original.record["param_digest"][0], rel=1e-5)


def test_every_process_starts_from_rank_zero_s_model(tmp_path):
    """fixtures/fsdp/trainer_one_statement.py makes its model after the per-process
    re-seed (rank 0's stream restarts too, so not the original's draw): shard_model
    broadcasts rank 0's values, so two processes end where one process under torchrun
    does (the same global batch of 16), not with rank 1's shards from another draw."""
    out = convert(FIXTURES_DIR / "fsdp" / "trainer_one_statement.py", tmp_path, "--to", "fsdp")
    (tmp_path / "probe.py").write_text(PROBE)
    digests = []
    for nproc in (1, 2):
        _check(run_ranks(tmp_path / "probe.py", (out,), tmp_path, nproc), f"{nproc} processes")
        record = json.loads((tmp_path / "record-0.json").read_text())
        assert record["exit"] == "ok"
        digests.append(record["param_digest"][0])
    assert digests[1] == pytest.approx(digests[0], rel=1e-5)
