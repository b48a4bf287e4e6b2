"""A training function given the DDP wrapper reads the model's own attributes from the
model itself, `unwrapped(model)` (fixtures/ddp/model_attributes_in_helper.py: a
distillation function reading `model.teacher` and `model.temperature`; it was refused:
"a DDP wrapper lacks the model's own attributes")."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "ddp" / "model_attributes_in_helper.py"
DDP = ConvertOptions(target="ddp", amp="off")


def test_the_function_gets_the_wrapper_and_reads_the_model_itself():
    conversion = convert_source(FIXTURE.read_text(encoding="utf-8"), DDP, FIXTURE.name)
    assert [s for s in conversion.log.skipped if s.wrong] == []
    code = conversion.converted
    assert "train_epoch(ddp_model, loader, optimizer)" in code
    assert "    unwrapped(model).teacher.eval()\n" in code
    assert "unwrapped(model).teacher(x) / unwrapped(model).temperature" in code
    assert "    return model.module if isinstance(model, DDP) else model\n" in code
    assert convert_source(code, DDP, FIXTURE.name).converted == code


def test_a_submodule_run_with_gradients_is_still_refused():
    """Outside `torch.no_grad()`, the teacher's forward could train layers outside DDP's
    forward: the function is not given the wrapper."""
    source = FIXTURE.read_text(encoding="utf-8").replace(
        "        with torch.no_grad():\n            soft =", "        if True:\n            soft ="
    )
    conversion = convert_source(source, DDP, FIXTURE.name)
    (refusal,) = [s for s in conversion.log.skipped if s.wrong]
    assert "cannot be routed to a DDP wrapper of `model`" in refusal.reason


@pytest.mark.runs
def test_the_conversion_is_proven(proven):
    proven(FIXTURE, "ddp")


UNUSED = FIXTURES_DIR / "ddp" / "unused_layer.py"


def test_a_layer_forward_never_uses_makes_ddp_find_unused_parameters():
    conversion = convert_source(UNUSED.read_text(encoding="utf-8"), DDP, UNUSED.name)
    code = conversion.converted
    assert "    # (`aux_head` gets no gradient: DDP must not wait for it)\n" in code
    assert "            find_unused_parameters=True,\n" in code
    plain = FIXTURE.read_text(encoding="utf-8")  # every layer used: DDP's default
    assert "find_unused_parameters" not in convert_source(plain, DDP, FIXTURE.name).converted


@pytest.mark.runs
def test_the_unused_layer_conversion_is_proven(cli, tmp_path):
    """Without the flag the proof stopped it: "Expected to have finished reduction"."""
    (tmp_path / "train.py").write_text(UNUSED.read_text(encoding="utf-8"))
    run = cli("convert", "train.py", "--to", "ddp", "--amp", "off", "-o", "out.py")
    assert run.exit_code == 0, run.stderr
