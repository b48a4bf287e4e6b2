"""`--to dp` on shapes of the fifth unseen-code measurement (bench31): an annotated
assignment between the forward pass and the loss (`out: Union[...] = criterion(...)`,
kd_study) was refused as "a `simplestatementline` block"; it is a plain line, and its
annotation, never evaluated for a local variable, is not an input of the loss."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")


def convert(name: str, replace: tuple[str, str] = ("", "")):
    source = (FIXTURES / name).read_text(encoding="utf-8").replace(*replace)
    return convert_source(source, DP, name)


def test_annotated_forward_and_loss_lines_move_into_the_loss_function() -> None:
    conversion = convert("annotated_step.py")
    assert [s for s in conversion.log.skipped if s.wrong] == []
    assert (
        "    def compute_loss(model, criterion, x, y):\n"
        "        # runs on each GPU's part of the batch\n"
        "        out: Union[Tensor, tuple] = model(x)\n"
        "        loss: Tensor = criterion(out, y)\n"
        "        return loss\n"
    ) in conversion.converted
    assert "            loss = loss_on_gpus(x, y).mean()" in conversion.converted


def test_a_bare_annotation_stays_in_the_loop() -> None:
    """`loss: Tensor` alone binds nothing: it stays where it is, the loss moves."""
    conversion = convert(
        "annotated_step.py",
        ("loss: Tensor = criterion", "loss: Tensor\n            loss = criterion"),
    )
    assert [s for s in conversion.log.skipped if s.wrong] == []
    assert "        loss = criterion(out, y)\n        return loss\n" in conversion.converted
    assert "            loss: Tensor\n" in conversion.converted


def test_a_line_that_assigns_nothing_in_an_autocast_block_is_quoted():
    """wgan-gp (the tenth unseen set): the refusal named "a `simplestatementline` block"
    for `self.losses['GP'].append(...)` between the forward pass and the loss."""
    source = dedent("""\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = nn.Linear(4, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
        history = []
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast("cuda", enabled=False):
                out = model(x)
                history.append(out.mean().item())
                loss = nn.functional.mse_loss(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)
    conversion = convert_source(source, ConvertOptions(target="dp", amp="off"), "train.py")
    (reason,) = [s.reason for s in conversion.log.skipped if s.wrong]
    assert "hold `history.append(out.mean().item())`, a line that assigns nothing," in reason
