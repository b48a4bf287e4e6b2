"""`convert --to ddp|fsdp` of training batches that a function of the project cuts from
tensors by slices of a `torch.randperm` (LSTNet's `get_batches`): the training call passes
each process its rows and the per-process batch, evaluation calls keep whole tensors, and
what the step cannot prove is refused with its line. fixtures/ddp/permuted_batches.py
against its snapshots (tests/snapshots/permuted_batches/, regenerated with
AUTOACCEL_UPDATE_SNAPSHOTS=1); what the ranks read is checked in
tests/test_convert_tensor_data_runs.py."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from test_facts import DDP, FSDP, wrong

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ddp"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "permuted_batches"
UPDATE = os.environ.get("AUTOACCEL_UPDATE_SNAPSHOTS") == "1"

SCRIPT = textwrap.dedent("""\
    import torch


    def get_batches(inputs, targets, batch_size):
        length = len(inputs)
        index = torch.randperm(length)
        for start in range(0, length, batch_size):
            excerpt = index[start:start + batch_size]
            yield inputs[excerpt], targets[excerpt]


    x, y = torch.randn(64, 4), torch.randn(64, 1)
    batch_size = 8
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in get_batches(x, y, batch_size):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """)


def convert(source: str, options: ConvertOptions = DDP):
    return convert_source(source, options, "train.py")


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_fixture_matches_snapshot(options):
    conversion = convert_source((FIXTURES / "permuted_batches.py").read_text(), options, "p.py")
    assert wrong(conversion) == []
    snapshot = SNAPSHOTS / f"permuted_batches.{options.target}.py"
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        snapshot.write_text(conversion.converted)
    assert conversion.converted == snapshot.read_text()


def test_a_method_s_batches_take_the_rows_of_the_training_call_only():
    """LSTNet's shape: `data.get_batches(...)` in a `train()` that receives the rows; the
    evaluation's call of the same method keeps the whole validation rows."""
    source = (FIXTURES / "permuted_batches_method.py").read_text()
    conversion = convert_source(source, DDP, "permuted_batches_method.py")
    assert wrong(conversion) == []
    code = conversion.converted
    assert (
        "    for x, y in data.get_batches(\n"
        "        shard_rows(inputs),\n"
        "        shard_rows(targets),\n"
        "        per_process_batch_size(batch_size),\n"
        "        True,\n"
        "    ):\n"
    ) in code  # black's style for the lengthened header
    assert "        for x, y in data.get_batches(inputs, targets, batch_size, False):\n" in code
    assert "return rows[RANK : len(rows) - len(rows) % WORLD_SIZE : WORLD_SIZE]" in code


def test_per_process_batch_keeps_the_batch_size_and_a_second_conversion_changes_nothing():
    kept = convert(SCRIPT, ConvertOptions(target="ddp", amp="off", per_process_batch=True))
    assert "get_batches(shard_rows(x), shard_rows(y), batch_size):" in kept.converted
    assert "per_process_batch_size" not in kept.converted
    once = convert(SCRIPT).converted
    compact = "".join(once.split())  # black splits the lengthened header
    assert "get_batches(shard_rows(x),shard_rows(y),per_process_batch_size(batch_size)):" in compact
    again = convert(once)
    assert wrong(again) == [] and again.converted == once


@pytest.mark.parametrize(
    "old, new, reason",
    [
        ("get_batches(x, y, batch_size)", "get_batches(x, y, 8)", "batch size `8` is not a variable"),
        ("yield inputs[excerpt], targets[excerpt]", "yield inputs[excerpt], y[excerpt]",
         "indexes data that the call does not pass"),
        ("torch.randperm(length)", "torch.randperm(64)", "length does not come from the rows"),
        ("length = len(inputs)", "length = len(inputs)\n    inputs.mul_(2)", "changes the rows"),
        ("optimizer.step()\n", "optimizer.step()\n        x = x[1:]\n", "rebuilds the rows"),
        ("loss.backward()", "if epoch:\n            loss.backward()", "only under a condition"),
    ],
    ids=["literal-batch", "other-data", "other-length", "mutated", "rebuilt", "conditional"],
)  # fmt: skip
def test_what_cannot_be_proven_is_refused_with_the_line(old, new, reason):
    source = SCRIPT.replace(old, new)
    assert source != SCRIPT
    (refusal,) = [s for s in convert(source).log.skipped if s.wrong]
    assert reason in refusal.reason
    assert "in get_batches(" in source.splitlines()[refusal.line - 1]
