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


def test_fsdp_refuses_a_part_of_the_model_run_on_its_own():
    """overhaul-distillation (the tenth unseen set): `test(t_net)` ran the teacher that
    `fully_shard(d_net)` had sharded with the distiller, outside its forward: mixed Tensor
    and DTensor, in the proof. Now refused at that call; ddp is unaffected."""
    source = FIXTURE.read_text(encoding="utf-8").replace(
        "    for epoch in range(2):\n",
        "    print(teacher(torch.randn(2, 4)).sum().item())\n    for epoch in range(2):\n",
    )
    options = ConvertOptions(target="fsdp", amp="off")
    conversion = convert_source(source, options, FIXTURE.name)
    (skip,) = [s for s in conversion.log.skipped if s.wrong]
    assert skip.line == 34
    assert (
        "`teacher(torch.randn(2, 4))` runs `self.teacher` of `distiller` on its own" in skip.reason
    )
    assert [s for s in convert(source).log.skipped if s.wrong] == []
