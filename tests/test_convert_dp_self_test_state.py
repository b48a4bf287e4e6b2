"""`--to dp` on shapes of the seventh unseen-code measurement (bench33): the `__main__`
smoke test of a module the script imports, which never runs (audio: it got the only
DataParallel, exit 0, while the real step was refused for a false reason), and a
stateful model told the batch size by attribute before each forward pass (lstmcls: the
replicas would run on parts of the batch with the whole batch's values)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
DP = ConvertOptions(target="dp", amp="off")
NOT_APPLIED = "loss inside forward (--to dp) not applied: "
IN_IF = """\
        if is_train:
            loss = F.cross_entropy(output, y)
"""
BEFORE_IF = """\
        loss = F.cross_entropy(output, y)
        if is_train:
"""


@pytest.fixture
def self_test_module(tmp_path, monkeypatch) -> Path:
    copy = tmp_path / "self_test_module"
    shutil.copytree(FIXTURES / "self_test_module", copy)
    monkeypatch.chdir(copy)
    monkeypatch.setenv("NO_COLOR", "1")
    return copy


def test_imported_modules_self_test_is_no_step_and_the_real_one_says_why(
    self_test_module, capsys
) -> None:
    """model.py's `__main__` test is left alone, so no DataParallel is added: exit 1, and
    the step's reason names the forward pass outside the `if` (not "a helper")."""
    assert command.run_convert(Path("train.py"), DP) == 1
    out, err = capsys.readouterr()
    assert (
        'line 20: loss inside forward (--to dp) not applied: this training loop is in the `if __name__ == "__main__":` block'
        " of model.py, which runs when model.py is run itself, not when the program imports it: left as it is"
        in out
    )
    assert (
        f"train.py:21:1: error: {NOT_APPLIED}`loss` is computed in an `if` block from `output`,"
        " which `model(x)` computes before that block" in err
    )
    assert "model.py" not in err and "helper" not in err


def test_imported_modules_self_test_stays_when_the_real_step_converts(
    self_test_module, capsys
) -> None:
    train = self_test_module / "train.py"
    train.write_text(train.read_text(encoding="utf-8").replace(IN_IF, BEFORE_IF), "utf-8")
    assert command.run_convert(Path("train.py"), DP, write=True) == 0
    assert "        loss, output = loss_on_gpus(x, y)\n" in train.read_text(encoding="utf-8")
    model = (self_test_module / "model.py").read_text(encoding="utf-8")
    assert "DataParallel" not in model and "LossInForward" not in model


def skipped(source: str) -> dict[int, str]:
    """The line and reason of each step refused."""
    conversion = convert_source(source, DP, str(FIXTURES / "stateful_batch_attribute.py"))
    return {s.line: s.reason for s in conversion.log.skipped if s.wrong}


STATEFUL = (FIXTURES / "stateful_batch_attribute.py").read_text(encoding="utf-8")
SIZE = "        model.batch_size = len(y)\n"
HIDDEN = "        model.hidden = model.init_hidden()\n"


@pytest.mark.parametrize(
    ("source", "line", "attribute"),
    [
        pytest.param(STATEFUL, 41, "model.batch_size", id="from-the-batch"),
        pytest.param(STATEFUL.replace(SIZE, ""), 41, "model.hidden", id="from-the-model"),
    ],
)
def test_an_attribute_the_step_sets_before_the_forward_pass_is_refused(
    source: str, line: int, attribute: str
) -> None:
    [(at, reason)] = skipped(source).items()
    assert at == line
    assert reason.startswith(
        f"the step sets `{attribute}` before the forward pass: each `nn.DataParallel` replica"
        " would see the whole batch's value"
    )


def test_an_attribute_the_model_never_reads_is_no_refusal() -> None:
    source = STATEFUL.replace(HIDDEN, "").replace("model.batch_size = ", "model.seen = ")
    code = convert_source(source, DP, "stateful.py").converted
    assert "        loss = loss_on_gpus(x, y).mean()  # mean of the per-GPU losses\n" in code


def test_a_transposed_input_moves_into_the_replicas() -> None:
    """`model(x.t())`: the simple shape would split `x.t()` along the sequence."""
    code = convert_source(STATEFUL.replace(SIZE, "").replace(HIDDEN, ""), DP, "s.py").converted
    assert "    out = model(x.t())\n" in code[code.index("def compute_loss") :]
    assert "        loss = loss_on_gpus(x, y).mean()  # mean of the per-GPU losses\n" in code
