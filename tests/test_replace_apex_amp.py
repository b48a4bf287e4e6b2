"""ReplaceApexAmp: apex.amp scripts converted to torch.amp, or left alone with the line."""

from __future__ import annotations

from textwrap import dedent

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import run_with_losses

APEX_SCRIPT = dedent("""\
    import torch
    import torch.nn as nn
    from apex import amp
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    loader = DataLoader(data, batch_size=16)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x.to(device)), y.to(device))
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """)


def convert(source: str, amp: str = "fp16"):
    return convert_source(source, ConvertOptions(amp=amp, workers="keep"))


def test_apex_becomes_autocast_and_grad_scaler() -> None:
    result = convert(APEX_SCRIPT)
    text = result.converted
    assert "apex" not in text and "amp.initialize" not in text
    assert 'scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")' in text
    assert "scaler.scale(loss).backward()\n" in text
    assert "scaler.step(optimizer)\n" in text and "scaler.update()\n" in text
    assert "dtype=torch.float16" in text
    assert not [s for s in result.log.skipped if "apex" in s.what or "ACC302" in s.what]


def test_bf16_needs_no_scaler() -> None:
    text = convert(APEX_SCRIPT, "bf16").converted
    assert "apex" not in text and "GradScaler" not in text
    assert "        loss.backward()\n" in text and "dtype=torch.bfloat16" in text


def test_apex_set_up_in_a_branch_of_its_own_leaves_a_pass() -> None:
    """The branch that only set up apex is empty after the rewrite: LibCST writes `pass`
    for it, and the positions of what follows (a decorated method) still match."""
    source = APEX_SCRIPT.replace(
        'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n',
        "use_amp = True\n"
        "if use_amp:\n"
        '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n\n\n'
        "class Log:\n"
        "    @staticmethod\n"
        "    def line(loss):\n"
        '        return f"loss {loss:.3f}"\n\n\n',
    )
    text = convert(source).converted
    assert "if use_amp:\n    pass\n" in text
    assert "amp.initialize" not in text


def test_amp_off_keeps_apex() -> None:
    assert "amp.initialize(model, optimizer" in convert(APEX_SCRIPT, "off").converted


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        pytest.param(
            "            scaled_loss.backward()\n",
            "            scaled_loss.backward()\n"
            "            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)\n",
            19,
            id="other-call-in-scale-loss",
        ),
        pytest.param(
            "model, optimizer = amp.initialize(",
            "net, optimizer = amp.initialize(",
            13,
            id="initialize-renames",
        ),
    ],
)
def test_apex_that_cannot_be_rewritten_is_left_with_its_line(old: str, new: str, line: int) -> None:
    source = APEX_SCRIPT.replace(old, new)
    result = convert(source)
    assert "from apex import amp" in result.converted
    assert "amp.initialize(" in result.converted and "amp.scale_loss(" in result.converted
    (refusal,) = [s for s in result.log.skipped if s.what == "apex.amp"]
    assert refusal.line == line


@pytest.mark.runs
def test_converted_apex_script_runs_without_apex(tmp_path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(convert(APEX_SCRIPT).converted)
    fp32 = tmp_path / "fp32.py"
    fp32.write_text(
        APEX_SCRIPT.replace("from apex import amp\n", "")
        .replace('model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n', "")
        .replace(
            "with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()",
            "loss.backward()",
        )
    )
    # On a CPU autocast and the scaler are disabled: the same numbers as plain float32.
    assert run_with_losses(script, [], tmp_path) == run_with_losses(fp32, [], tmp_path)
