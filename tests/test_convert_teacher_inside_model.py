"""A teacher held inside the model DDP wraps, run in `forward()` but trained by no
optimizer (overhaul-distillation's `Distiller`, the tenth unseen set: its parameters got no
gradient and DDP failed at the second step): `find_unused_parameters=True`.
fixtures/ddp/teacher_inside_model.py."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "ddp" / "teacher_inside_model.py"


def convert(source: str):
    return convert_source(source, ConvertOptions(target="ddp", amp="off"), FIXTURE.name)


def test_a_layer_no_optimizer_trains_makes_ddp_find_unused_parameters():
    code = convert(FIXTURE.read_text(encoding="utf-8")).converted
    assert "    # (`teacher` gets no gradient: DDP must not wait for it)\n" in code
    assert "            find_unused_parameters=True,\n" in code


@pytest.mark.parametrize(
    "trained",
    [
        "[*distiller.parameters()]",
        "[*student.parameters(), *head.parameters(), *distiller.connector.parameters(),"
        " *distiller.teacher.parameters()]",
        "[*student.parameters(), *head.parameters(), *distiller.connector.parameters(),"
        " *teacher.parameters()]",
    ],
    ids=["the-whole-model", "by-its-attribute", "by-its-own-name"],
)
def test_every_layer_trained_needs_no_unused_parameters(trained):
    """A teacher trained along (its target not detached, its parameters given to the
    optimizer one way or another) gets its gradients: DDP need not look for unused ones."""
    source = FIXTURE.read_text(encoding="utf-8").replace("target.detach()", "target")
    source = source.replace(
        "    trained = [*student.parameters(), *head.parameters(),"
        " *distiller.connector.parameters()]\n",
        f"    trained = {trained}\n",
    )
    assert f"    trained = {trained}\n" in source
    code = convert(source).converted
    assert "DDP(" in code and "            find_unused_parameters=True,\n" not in code


@pytest.mark.runs
def test_the_conversion_is_proven(proven):
    proven(FIXTURE, "ddp")
