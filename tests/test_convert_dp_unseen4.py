"""`--to dp` on shapes of the fifth unseen-code measurement (bench31): an annotated
assignment between the forward pass and the loss (`out: Union[...] = criterion(...)`,
kd_study) was refused as "a `simplestatementline` block"; it is a plain line, and its
annotation, never evaluated for a local variable, is not an input of the loss."""

from __future__ import annotations

from pathlib import Path

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
