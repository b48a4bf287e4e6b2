"""A trained model called through its `forward` method (ninth unseen set F2,
siamese-pytorch's `net.forward(img1, img2)`) is called as the module by every multi-GPU
target: no trained model was found ("not called by a name the conversion can wrap"),
and a sharded model's hooks would not run. fixtures/ddp/forward_method_call.py."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = FIXTURES_DIR / "ddp" / "forward_method_call.py"


def convert(target: str, source: str | None = None):
    text = FIXTURE.read_text(encoding="utf-8") if source is None else source
    return convert_source(text, ConvertOptions(target=target, amp="off"), FIXTURE.name)


@pytest.mark.parametrize(
    "target, call", [("ddp", "ddp_net(a, b)"), ("fsdp", "net(a, b)")], ids=["ddp", "fsdp"]
)
def test_the_forward_method_call_becomes_a_call_of_the_module(target, call):
    conversion = convert(target)
    assert [s for s in conversion.log.skipped if s.wrong] == []
    assert f"            output = {call}\n" in conversion.converted
    assert "output = net.forward(a, b)" not in conversion.converted
    (change,) = [c for c in conversion.log.changes if c.code == "forward-call"]
    assert change.line == 30


def test_forward_calls_of_other_objects_stay():
    """`super().forward(x)`, `self.forward(x)` and the forward of a model nothing trains
    are left as they are; `--to single` changes no call."""
    source = (
        FIXTURE.read_text(encoding="utf-8")
        .replace("    net = Siamese()\n", "    net = Siamese()\n    frozen = Siamese()\n")
        .replace(
            "            output = net.forward(a, b)\n",
            "            output = net.forward(a, b) + frozen.forward(a, b).detach()\n",
        )
    )
    assert "frozen.forward(a, b)" in convert("ddp", source).converted
    assert "net.forward(a, b)" in convert("single", source).converted


@pytest.mark.runs
@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_the_conversion_is_proven(target, proven):
    """Written only after the proof: two processes, parameters equal, losses as before."""
    assert "output = net.forward(a, b)" not in proven(FIXTURE, target)


@pytest.mark.parametrize("target", ["ddp", "dp", "fsdp"])
def test_the_call_is_made_before_autocast_so_a_second_pass_changes_nothing(target, cli, tmp_path):
    """Made after AddAutocast, the module call got its autocast only on a second pass:
    "a step is not idempotent", nothing written (the ninth set's re-run, siamese). (FSDP
    adds no autocast.)"""
    source = (
        FIXTURE.read_text(encoding="utf-8")
        .replace(
            "    net = Siamese()\n",
            '    device = "cuda" if torch.cuda.is_available() else "cpu"\n'
            "    net = Siamese().to(device)\n",
        )
        .replace(
            "            output = net.forward(a, b)\n",
            "            a, b, y = a.to(device), b.to(device), y.to(device)\n"
            "            output = net.forward(a, b)\n",
        )
    )
    (tmp_path / "train.py").write_text(source)
    run = cli("convert", "train.py", "--to", target, "--no-run", "-o", "out.py")
    assert run.exit_code == 0, run.stderr
    assert ("torch.autocast(" in (tmp_path / "out.py").read_text()) is (target != "fsdp")
