"""`--to dp` on the shapes of three public scripts it refused (issue 30), as fixtures of
fixtures/dp/: a forward pass picked by an `if` (conditional_forward.py), batches drawn by
`.next()` of the script's own class around a DataLoader (infinite_loader.py), and a
project whose distillation step runs in one module, next to a training function nothing
calls, with a warm-up step in another that it cannot convert (distill_stages/)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from autoaccel.convert import command
from autoaccel.convert.log import ConversionLog, ConvertOptions, Skipped
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.transforms.data_parallel import settle_project_refusals

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "dp_unseen"
UPDATE = os.environ.get("AUTOACCEL_UPDATE_SNAPSHOTS") == "1"
DP = ConvertOptions(target="dp", amp="off")
STEP = "loss inside forward (--to dp)"


def converted(name: str):
    return convert_source((FIXTURES / name).read_text(encoding="utf-8"), DP, str(FIXTURES / name))


@pytest.mark.parametrize("name", ["conditional_forward.py", "infinite_loader.py"])
def test_conversion_matches_snapshot(name: str) -> None:
    """conditional_forward.py: the `if` moves into `compute_loss` whole, both branches'
    inputs passed split. infinite_loader.py: `X, Y` unpacked from
    `batch_loader.next()`, whose `next()` returns what `next()` drew from a DataLoader,
    are batch-first (refused before: "`X` is made in the step but not from the batch")."""
    result = converted(name)
    assert [c.code for c in result.log.changes if c.code == "ACC402"] == ["ACC402"]
    assert not [s for s in result.log.skipped if s.wrong]
    snapshot = SNAPSHOTS / name.replace(".py", ".dp.py")
    if UPDATE:
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_text(result.converted, encoding="utf-8")
    assert result.converted == snapshot.read_text(
        encoding="utf-8"
    ), "regenerate with AUTOACCEL_UPDATE_SNAPSHOTS=1"


def test_a_project_class_that_makes_its_batches_is_not_a_loader() -> None:
    """The same loop over a class whose `next()` makes new tensors (no DataLoader in it)
    is still refused: nothing shows what it returns to be batch-first."""
    source = (FIXTURES / "infinite_loader.py").read_text(encoding="utf-8")
    source = source.replace(
        "            batch = next(self.batches)\n",
        "            batch = [torch.randint(0, 11, (8, 8))] * 2\n",
    )
    result = convert_source(source, DP, "endless.py")
    assert "LossInForward" not in result.converted
    assert [
        "`X` is made in the step but not from the batch" in s.reason
        for s in result.log.skipped
        if s.wrong
    ] == [True]


@pytest.fixture
def distill_stages(tmp_path, monkeypatch) -> Path:
    copy = tmp_path / "distill_stages"
    shutil.copytree(FIXTURES / "distill_stages", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(copy)
    monkeypatch.setenv("NO_COLOR", "1")
    return copy


def test_project_converts_the_step_the_entry_point_runs(distill_stages, capsys) -> None:
    """`train_distill` converts, saying why the teacher is not replicated; `train_plain`,
    which nothing calls, is left alone (it got the DataParallel before); the warm-up step
    it cannot convert is noted, no longer a refusal of the whole project (exit 1, "no
    DataParallel was added" while loops.py got one)."""
    assert command.run_convert(Path("train.py"), DP, write=True) == 0
    out, err = capsys.readouterr()
    assert "error" not in err
    assert (
        "`teacher` is not replicated: its outputs carry no gradients (`torch.no_grad()`, or no"
        " optimizer trains it), so it has none to reduce" in out
    )
    assert (
        "line 6: loss inside forward (--to dp) not applied: this training loop is in `train_plain()`, which nothing in the program calls: left as it is"
        in out
    )
    assert (
        "line 9: loss inside forward (--to dp) not applied: `loss` is computed in an `if` block"
        in out
    )
    loops = (distill_stages / "loops.py").read_text(encoding="utf-8")
    plain = loops[loops.index("def train_plain") : loops.index("def train_distill")]
    assert "        loss = F.cross_entropy(model(x), y)\n" in plain  # its step as it was
    assert "        loss = loss_on_gpus(x, soft, y).mean()  # mean of the per-GPU losses\n" in loops
    assert (distill_stages / "pretrain.py").read_text(encoding="utf-8").count(
        "loss = "
    ) == 2  # not converted


def test_project_whose_running_step_is_refused_names_it(distill_stages, capsys) -> None:
    """Where the distillation step cannot convert either, the project is refused, and its
    reason is an error at its own line, as the warm-up step's."""
    loops = distill_stages / "loops.py"
    loops.write_text(
        loops.read_text(encoding="utf-8").replace(
            "        logits = student(x)\n",
            "        logits = student(x)\n        logits = logits - logits.mean(0)\n",
        ),
        encoding="utf-8",
    )
    assert command.run_convert(Path("train.py"), DP) == 1
    err = capsys.readouterr().err
    assert (
        "loops.py:19:1: error: loss inside forward (--to dp) not applied: `.mean(...)` mixes the samples of the batch"
        in err
    )
    assert (
        "pretrain.py:9:1: error: loss inside forward (--to dp) not applied: `loss` is computed in an `if` block"
        in err
    )
    assert "train_plain" not in err


def test_step_refusals_stay_refusals_where_no_file_gets_a_data_parallel() -> None:
    refused = Skipped(
        STEP,
        3,
        "`loss` is computed in an `if` block; by hand: compute the loss in the"
        " `forward` of an `nn.Module` (the model itself, or a wrapper holding the model and"
        " its loss function), wrap that module in `nn.DataParallel` and call `.mean()` on"
        " its result before `backward()`",
        wrong=True,
    )
    logs = [ConversionLog(skipped=[refused]), ConversionLog()]
    settle_project_refusals(logs)
    assert logs[0].skipped[0].wrong
