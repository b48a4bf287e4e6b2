"""A proof whose conversion crashes on one process names that process's error at the
user's line (tests/test_convert_proof_failures.py reads captured output): a conversion
written by hand fails an assertion on rank 0 only, while rank 1 waits in the next
gradient all-reduce and then loses its connection."""

from __future__ import annotations

import textwrap

import pytest

from autoaccel.convert.verify import VerifyRequest, verify_ddp, write_one

pytestmark = pytest.mark.runs

ORIGINAL = textwrap.dedent("""\
    import torch

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8)
    for x in loader:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        assert len(x) == 8, "a batch of 8"
        loss.backward()
        optimizer.step()
    """)
BROKEN = (
    ORIGINAL.replace(
        "import torch\n",
        "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\nRANK = dist.get_rank()\n",
    )
    .replace(
        "model = torch.nn.Linear(4, 1)\n",
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n",
    )
    .replace("batch_size=8", "batch_size=4")
    .replace("        assert", "        if RANK == 0:\n            assert")
)


def test_the_failing_process_is_named_at_the_users_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(ORIGINAL)
    found, log = verify_ddp(
        tmp_path / "train.py", write_one(tmp_path / "train.py", BROKEN), VerifyRequest([], 4), []
    )
    (finished,) = found
    assert finished.detail == "train.py:9: AssertionError: a batch of 8 (process 0)"
    assert log.rstrip().endswith(
        "AssertionError: a batch of 8"
    ), log  # the output up to the failure
