"""`--to dp` makes tensors of NumPy batches and moves inputs to the device before the
wrapped call, not in the lines each GPU runs (DA-RNN, the tenth unseen set: written, and
wrong on two GPUs or more: `nn.DataParallel` splits tensors only, and every replica moved
its part back to `cuda:0`). fixtures/dp/numpy_windows.py."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR, run_script

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "dp" / "numpy_windows.py"
DP = ConvertOptions(target="dp", amp="off")


def convert(source: str):
    return convert_source(source, DP, FIXTURE.name)


def test_the_inputs_are_made_tensors_on_the_device_before_the_call():
    conversion = convert(FIXTURE.read_text(encoding="utf-8"))
    code = conversion.converted
    assert (
        "def compute_loss(encoder, decoder, criterion, x, y):\n"
        "    # runs on each GPU's part of the batch\n"
        "    encoded = encoder(x)\n"
        "    prediction = decoder(encoded)\n"
        "    loss = criterion(prediction, y)\n"
        "    return loss\n"
    ) in code
    assert (
        "        loss = self.loss_on_gpus(\n"
        "            torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)\n"
        "        ).mean()  # mean of the per-GPU losses\n"
    ) in code
    assert not conversion.log.skipped


def test_a_numpy_input_also_read_as_it_is_is_refused():
    source = FIXTURE.read_text(encoding="utf-8").replace(
        "        prediction = self.decoder(encoded)\n",
        "        prediction = self.decoder(encoded) + torch.from_numpy(x[:, -1, :1]).to(device)\n",
    )
    conversion = convert(source)
    assert "loss_on_gpus" not in conversion.converted
    (skip,) = conversion.log.skipped
    assert "`x` is made a tensor in the forward pass" in skip.reason
    assert "hand whole to every GPU" in skip.reason and skip.line == 33


@pytest.mark.runs
def test_the_conversion_trains_as_the_original(tmp_path):
    """On the CPU the wrapper is not built and the function runs as it is: the same
    losses, to the last digit printed."""
    converted = tmp_path / "numpy_windows.py"
    converted.write_text(convert(FIXTURE.read_text(encoding="utf-8")).converted)
    original = run_script(FIXTURE).stdout
    assert "epoch 2: loss" in original
    assert run_script(converted).stdout == original
