"""fixtures/ddp/inline_loader.py, whose training DataLoader is built in the call that trains
on it, converted and run on two processes (gloo, CPU) through the harness: in every pass
the ranks train on disjoint halves of the data, which together make all of it, and (one
shuffled batch per epoch, a mean loss) they end with equal parameters, the original's."""

from __future__ import annotations

import json

import pytest
from running import FIXTURES_DIR, _check, convert, run_ranks, run_under_harness
from test_convert_wrap_placement_runs import PROBE

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_ranks_train_on_disjoint_shards_and_end_as_the_original(tmp_path, target):
    fixture = FIXTURES_DIR / "ddp" / "inline_loader.py"
    out = convert(fixture, tmp_path, "--to", target, "--amp", "off")
    original = run_under_harness(fixture, [], tmp_path)
    assert original.returncode == 0, original.stderr
    (tmp_path / "probe.py").write_text(PROBE)
    _check(run_ranks(tmp_path / "probe.py", (out,), tmp_path), f"torchrun {out.name}")
    records = [json.loads((tmp_path / f"record-{rank}.json").read_text()) for rank in range(2)]
    assert [r["exit"] for r in records] == ["ok", "ok"]
    passes = [dict(r["sample_ids"]) for r in records]  # pass -> the indices of its one step
    assert passes[0].keys() == passes[1].keys() and len(passes[0]) == 3  # one pass an epoch
    for epoch in passes[0]:
        first, second = set(passes[0][epoch]), set(passes[1][epoch])
        assert not first & second and first | second == set(range(32))
    digests = [r["param_digest"][0] for r in records]
    assert digests[0] == pytest.approx(digests[1], rel=1e-9)
    assert digests[0] == pytest.approx(original.record["param_digest"][0], rel=1e-5)
