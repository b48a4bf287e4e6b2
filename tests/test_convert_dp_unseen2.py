"""`--to dp` on shapes of the second unseen-code measurement (bench30, issue 30): a
script that never moves its model to a GPU (fixtures/dp/cpu_only_rnn.py) got an
`nn.DataParallel` behind `next(model.parameters()).is_cuda`, which never engaged, and
exited 0 saying the loss was computed "inside forward on every GPU"."""

from __future__ import annotations

from pathlib import Path

from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")
NO_GPU = (
    "the script never moves the model to a GPU (no `.cuda()`, no `.to(device)` with a CUDA"
    " device): `nn.DataParallel` would never run; move the model to cuda first"
)


def cpu_only(replace: tuple[str, str] = ("", "")) -> str:
    return (FIXTURES / "cpu_only_rnn.py").read_text(encoding="utf-8").replace(*replace)


def test_script_that_never_uses_a_gpu_is_refused_naming_its_model(tmp_path, capsys) -> None:
    script = tmp_path / "cpu_only_rnn.py"
    script.write_text(cpu_only())
    assert command.run_convert(script, DP, write=True) == 1
    err = capsys.readouterr().err
    assert f"cpu_only_rnn.py:25:1: error: DataParallel (--to dp) not applied: {NO_GPU}" in err
    assert script.read_text() == cpu_only()  # nothing written


def test_no_step_is_planned_nor_reported_as_converted() -> None:
    conversion = convert_source(cpu_only(), DP, "cpu_only_rnn.py")
    assert "ModelWithLoss" not in conversion.converted
    assert not [c for c in conversion.log.changes if c.code == "ACC402"]
    assert [(s.line, s.wrong) for s in conversion.log.skipped if s.reason == NO_GPU] == [(25, True)]


def test_a_model_moved_to_cuda_converts() -> None:
    conversion = convert_source(
        cpu_only(("model = Classifier()", "model = Classifier().cuda()")), DP, "gpu.py"
    )
    assert "loss = model_with_loss(b_x, b_y).mean()" in conversion.converted
    assert not [s for s in conversion.log.skipped if s.wrong]


def test_a_device_the_code_does_not_name_may_be_a_gpu() -> None:
    """`.to(device)` of a `device` passed in (a library's trainer): it may be CUDA."""
    source = cpu_only().replace(
        "for epoch in range(2):\n",
        "def fit(model, device):\n    model.to(device)\n\n\nfor epoch in range(2):\n",
    )
    conversion = convert_source(source, DP, "library.py")
    assert "ModelWithLoss(model, loss_func)" in conversion.converted
