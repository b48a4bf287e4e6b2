"""Autocast around a forward pass that is a method of the model, not its forward()
(fixtures/ddp/method_log_probs.py, the shape of an unseen normalizing-flow trainer):
`loss = -model.log_probs(x).mean()`. `--to ddp` calls it through a wrapper,
`ddp_model_log_probs(x)`, a model call to the second conversion of the result, which
then added the autocast the first had not: "a step is not idempotent", nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "method_log_probs.py"
AUTOCAST = (
    "        with torch.autocast(\n"
    '            device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"\n'
    "        ):\n"
    "            loss = -{}(x).mean()\n"
)


@pytest.mark.parametrize(
    ("target", "call"), [("single", "model.log_probs"), ("ddp", "ddp_model_log_probs")]
)
def test_the_method_forward_pass_is_autocast_once(target: str, call: str) -> None:
    # (convert_source converts its result again: the second must change nothing)
    conversion = convert_source(FIXTURE.read_text(), ConvertOptions(target=target), FIXTURE.name)
    assert AUTOCAST.format(call) in conversion.converted
    assert not [s for s in conversion.log.skipped if s.what == "autocast"]
