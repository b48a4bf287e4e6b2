"""Terminal and plot output that project helpers make (S2 of bench 31: a ViT trainer's
`progress_bar`, CycleGAN's `Logger.log`, a triplet network's `VisdomLinePlotter.plot`).

- fixtures/ddp/project_progress: `train.py` calls `utils.progress_bar(...)`, which writes
  with `sys.stdout.write` and times its steps in module globals, and `logger.log(...)`,
  which sums the losses it prints in `self`. Both keep state that only their own output
  reads, so `--to ddp`/`--to fsdp` run the calls on rank 0 (`utils.py` stays as it is);
  a helper whose kept state the training reads stays on every process, noted.
- A visdom plotter of the script itself returns early on the other ranks.

tests/test_convert_project_output_runs.py runs the fixture under torchrun.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from autoaccel.analysis.side_effects import EffectKind, function_writes
from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import FIXTURES_DIR

PROJECT = FIXTURES_DIR / "ddp" / "project_progress"
GUARDED = (
    '        if RANK == 0:\n            progress_bar(i, len(loader), "Loss: %.3f" % loss.item())\n'
    '    if RANK == 0:\n        logger.log({"loss": loss})\n'
)


def copy_project(tmp_path: Path) -> Path:
    shutil.copytree(PROJECT, tmp_path / "project")
    return tmp_path / "project"


def writes_of(source: str) -> dict[str, tuple[EffectKind, frozenset[str] | None]]:
    found = function_writes(cst.parse_module(textwrap.dedent(source)))
    return {f.name.value: (w.kind, w.keeps) for f, w in found.items()}


def test_a_bar_and_a_logger_keep_state_of_their_own():
    writes = writes_of((PROJECT / "utils.py").read_text())
    assert writes == {
        "progress_bar": (EffectKind.PRINT, frozenset()),
        "log": (EffectKind.PRINT, frozenset({"losses", "epoch"})),
    }


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(
            "import sys\nstep = 0\ndef bar(i):\n    global step\n    step = i\n"
            "    sys.stdout.write(str(i))\ndef seen():\n    return step\n",
            id="global-read-by-another-function",
        ),
        pytest.param(
            "import sys\ndef bar(i, seen):\n    seen.append(i)\n    sys.stdout.write(str(i))\n",
            id="changes-a-parameter",
        ),
        pytest.param(
            "import sys\ndef bar(i):\n    sys.stdout.write(str(i))\n    return i + 1\n",
            id="returns-a-value",
        ),
        pytest.param(
            "import sys, torch\nclass Log:\n    def log(self, model):\n"
            "        model.train()\n        sys.stdout.write('x')\n",
            id="calls-a-method-of-a-parameter",
        ),
        pytest.param(
            "class Trainer:\n    def run(self):\n        optimizer = self.optimizer\n"
            "        for x in self.loader:\n            optimizer.step()\n"
            "            print('step')\n",
            id="trains",
        ),
    ],
)
def test_a_writer_that_does_other_work_keeps_nothing_of_its_own(source):
    kind, keeps = next(iter(writes_of(source).values()))
    assert kind is EffectKind.PRINT and keeps is None


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_the_calls_of_a_bar_and_a_logger_run_on_rank_zero(tmp_path, capsys, target):
    folder = copy_project(tmp_path)
    options = ConvertOptions(target=target, amp="off")
    assert command.run_convert(folder / "train.py", options, output=tmp_path / "out") == 0
    assert GUARDED in (tmp_path / "out" / "train.py").read_text()
    # the helpers' module is not rewritten
    assert (tmp_path / "out" / "utils.py").read_text() == (PROJECT / "utils.py").read_text()
    out = capsys.readouterr().out
    assert f"line 19: {target} print on rank 0 only" in out
    assert f"line 20: {target} print on rank 0 only" in out


def test_a_logger_whose_state_the_training_reads_stays_on_every_rank(tmp_path, capsys):
    folder = copy_project(tmp_path)
    train = folder / "train.py"
    train.write_text(
        train.read_text().replace(
            '    logger.log({"loss": loss})\n',
            '    logger.log({"loss": loss})\n    if logger.epoch > 5:\n        break\n',
        )
    )
    options = ConvertOptions(target="ddp", amp="off")
    assert command.run_convert(train, options, output=tmp_path / "out") == 0
    converted = (tmp_path / "out" / "train.py").read_text()
    assert '\n    logger.log({"loss": loss})\n' in converted
    assert (
        "line 20: rank-0 print not applied: `log()` (utils.py:28) writes on every process: it"
        " also keeps `logger.epoch`, which train.py reads, so every process runs it; put its"
        " writes under `if RANK == 0:` by hand"
    ) in capsys.readouterr().out


VISDOM_PLOTTER = """\
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset
from visdom import Visdom


class LinePlotter:
    def __init__(self):
        self.viz = Visdom()
        self.plots = {}

    def plot(self, name, x, y):
        if name not in self.plots:
            self.plots[name] = self.viz.line(X=np.array([x]), Y=np.array([y]))
        else:
            self.viz.line(X=np.array([x]), Y=np.array([y]), win=self.plots[name], update="append")


model = torch.nn.Linear(4, 1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
plotter = LinePlotter()
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    plotter.plot("loss", epoch, loss.item())
"""


def test_a_visdom_plotter_of_the_script_plots_on_rank_zero():
    result = convert_source(VISDOM_PLOTTER, ConvertOptions(target="ddp", amp="off"))
    assert (
        "    def plot(self, name, x, y):\n        if RANK != 0:\n"
        "            return  # only rank 0 writes\n"
    ) in result.converted
    assert '\n    plotter.plot("loss", epoch, loss.item())\n' in result.converted
    assert not [s for s in result.log.skipped if s.what.startswith("rank-0")]
