"""`--to dp` on shapes of the second unseen-code measurement (bench30, issue 30): a
script that never moves its model to a GPU (fixtures/dp/cpu_only_rnn.py) got an
`nn.DataParallel` behind `next(model.parameters()).is_cuda`, which never engaged, and
exited 0 saying the loss was computed "inside forward on every GPU". Refusals with false
reasons: a `model.zero_grad()` between the forward pass and the loss ended the search for
the forward pass ("no model is called"), and a batch drawn by a function of the script
(`real_samples()`) was taken for a loss ("one value for the whole batch")."""

from __future__ import annotations

import shutil
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


def test_zero_grad_between_the_forward_pass_and_the_loss_converts() -> None:
    name = "zero_grad_before_loss.py"
    conversion = convert_source((FIXTURES / name).read_text(encoding="utf-8"), DP, name)
    assert (
        "        outputs = model(tokens)\n"
        "        loss = F.nll_loss(F.log_softmax(outputs, dim=1), labels)\n"
        "        return loss\n" in conversion.converted
    )
    assert (
        "            loss = loss_on_gpus(tokens, labels).mean()  # mean of the per-GPU losses\n"
        "            model.zero_grad()\n"
        "            loss.backward()\n" in conversion.converted
    )
    assert not [s for s in conversion.log.skipped if s.wrong]


def test_a_model_picked_by_name_at_run_time_is_refused_for_what_it_is(cli, tmp_path) -> None:
    """`import_module(...).Classifier()`: `model(tokens)` is found above the
    `model.zero_grad()`, and the refusal says the code does not show it to be a model."""
    project = tmp_path / "model_by_name"
    shutil.copytree(FIXTURES / "model_by_name", project)
    result = cli("convert", str(project / "run.py"), "--to", "dp", "--amp", "off", "--no-run")
    assert result.exit_code == 1
    assert (
        "trainer.py:12:1: error: loss inside forward (--to dp) not applied: `model(...)` computes"
        " `loss`, but the code does not show it to be a model" in result.stderr
    )


def test_a_batch_drawn_by_a_function_of_the_script_is_no_loss() -> None:
    """`real = real_samples()` returns a (64, 8) tensor, which it does not reduce: the
    code cannot tell it is batch-first (nor `z = torch.randn(64, 4)`, made with a size no
    loader gives), but it is not "one value for the whole batch"."""
    name = "gan_drawn_batches.py"
    conversion = convert_source((FIXTURES / name).read_text(encoding="utf-8"), DP, name)
    assert "LossInForward" not in conversion.converted
    assert sorted((s.line, s.reason.split(":")[0]) for s in conversion.log.skipped if s.wrong) == [
        (
            25,
            "`real` is made in the step but not from the batch, so it is not known to be batch-first",
        ),
        (
            26,
            "`z` is made in the step but not from the batch, so it is not known to be batch-first",
        ),
    ]
