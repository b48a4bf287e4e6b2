"""A model built and trained inside a `try:` body (DDPM, the tenth unseen set: "no
trained model was recognised", ddp and fsdp). fixtures/ddp/try_around_training.py."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "ddp" / "try_around_training.py"


def convert(target: str, source: str | None = None):
    text = FIXTURE.read_text(encoding="utf-8") if source is None else source
    return convert_source(text, ConvertOptions(target=target, amp="off"), FIXTURE.name)


@pytest.mark.parametrize(
    "target, made",
    [("ddp", "            ddp_model = DDP(\n"), ("fsdp", "            shard_model(model)\n")],
)
def test_the_model_trained_in_a_try_body_is_wrapped_there(target, made):
    conversion = convert(target)
    assert [s.reason for s in conversion.log.skipped if s.wrong] == []
    code = conversion.converted
    assert made in code
    assert code.index(made) < code.index("        for epoch in range(2):")
    assert code.index("    try:\n") < code.index(made)


BUILT_IN_TRY = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
try:
    model = torch.load("model.pt", weights_only=False)
except OSError:
    model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(data, batch_size=8)
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_model_built_in_a_try_and_trained_after_it_is_wrapped_after_it():
    """No training in the `try:` body: the model is ready after the whole statement (its
    `except` builds it too), as before."""
    conversion = convert("ddp", BUILT_IN_TRY)
    assert [s.reason for s in conversion.log.skipped if s.wrong] == []
    code = conversion.converted
    assert code.index("    model = nn.Linear(4, 1)\n") < code.index("ddp_model = model\n")
    assert code.index("ddp_model = model\n") < code.index("optimizer = torch.optim.SGD(")


@pytest.mark.runs
@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_the_conversion_is_proven(target, proven):
    proven(FIXTURE, target)
