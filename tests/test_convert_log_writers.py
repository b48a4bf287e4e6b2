"""The project's own log writers under `--to ddp`/`--to fsdp` (T11 of bench 32).

- fixtures/facts/logger_class: `train.py` makes the project's `Logger` (logger.py), which
  opens log.txt in `__init__` and writes it in `set_names()`/`append()` (bearpaw's). Every
  process wrote the file; now it is made on rank 0 and the other ranks get a `NoWriter()`.
  A class whose state other code reads, or whose methods do other work, stays as it is.
- fixtures/ddp/logging_file_handler.py: `logging.basicConfig(handlers=[FileHandler(...),
  StreamHandler()])` (melgan's): the file handler is made on rank 0 only; the other ranks
  get a `logging.NullHandler()` and keep the terminal.

tests/test_convert_log_writers_runs.py runs the logger fixture through the proof.
"""

from __future__ import annotations

import shutil

import pytest

from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import FIXTURES_DIR

PROJECT = FIXTURES_DIR / "facts" / "logger_class"
HANDLER = FIXTURES_DIR / "ddp" / "logging_file_handler.py"
DDP = ConvertOptions(target="ddp", amp="off")
MADE_ON_RANK_ZERO = (
    "    logger = (\n"
    '        Logger(os.path.join("checkpoint", "log.txt"), title="demo")\n'
    "        if RANK == 0\n"
    "        else NoWriter()\n"
    "    )\n"
    '    logger.set_names(["Epoch", "Train Loss"])\n'
)


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_a_logger_that_writes_its_own_file_is_made_on_rank_zero(tmp_path, capsys, target):
    shutil.copytree(PROJECT, tmp_path / "project")
    options = ConvertOptions(target=target, amp="off")
    output = tmp_path / "train_converted.py"
    assert command.run_convert(tmp_path / "project" / "train.py", options, output=output) == 0
    converted = output.read_text()
    assert MADE_ON_RANK_ZERO in converted
    assert "    logger.close()\n    logger.plot()\n" in converted  # no rank test of their own
    out = capsys.readouterr().out
    assert (
        f"line 21: {target} `Logger` logger made on rank 0 only; the other ranks log through"
        " `NoWriter()`, which does nothing"
    ) in out
    assert "rank-0 file write not applied" not in out


LOGGER = """\
import torch


class Logger:
    def __init__(self, path):
        self.file = open(path, "w")
        self.losses = []

    def append(self, loss):
        self.file.write("%.4f\\n" % loss)
        self.losses.append(loss)
{extra}

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8
)
logger = Logger("log.txt")
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    logger.append(loss.item())
{after}"""


@pytest.mark.parametrize(
    "extra, after, replaced",
    [
        ("", "", True),
        ("", "print(min(logger.losses))\n", False),  # the script reads its state
        (
            "\n    def step(self, model):\n        self.file.write('step')\n        model.eval()\n",
            "",
            False,  # it changes the model as well
        ),
        ("\n    def last(self):\n        return self.losses[-1]\n", "", False),  # it answers
        (
            "\n    def reset(self, losses):\n        self.losses = losses\n",
            "",
            False,
        ),  # not its own
    ],
    ids=["only-logs", "state-read", "other-work", "returns-a-value", "keeps-a-parameter"],
)
def test_only_a_logger_that_does_nothing_else_is_made_on_rank_zero(extra, after, replaced):
    source = LOGGER.replace("{extra}", extra).replace("{after}", after)
    converted = convert_source(source, DDP).converted
    assert ('logger = Logger("log.txt") if RANK == 0 else NoWriter()\n' in converted) is replaced
    assert ("class NoWriter:" in converted) is replaced


def test_a_logging_file_handler_is_made_on_rank_zero():
    conversion = convert_source(HANDLER.read_text(), DDP, str(HANDLER))
    assert (
        "        handlers=[\n"
        "            (\n"
        '                logging.FileHandler(os.path.join("logs", "run-%d.log" % time.time()))\n'
        "                if RANK == 0\n"
        "                else logging.NullHandler()\n"
        "            ),\n"
        "            logging.StreamHandler(),\n"
    ) in conversion.converted
    assert "NoWriter" not in conversion.converted
    assert (
        20,
        "`logging` file handler made on rank 0 only; the other ranks log through their other"
        " handlers (a `logging.NullHandler()` in its place)",
    ) in {(c.line, c.description) for c in conversion.log.changes}
    assert convert_source(conversion.converted, DDP).converted == conversion.converted


@pytest.mark.parametrize(
    "made, chosen",
    [
        (
            'from logging import FileHandler\nhandler = FileHandler("train.log")\n',
            'handler = FileHandler("train.log") if RANK == 0 else logging.NullHandler()\n',
        ),
        (
            'import logging.handlers\nhandler = logging.handlers.RotatingFileHandler("train.log")\n',
            "handler = (\n"
            '    logging.handlers.RotatingFileHandler("train.log")\n'
            "    if RANK == 0\n"
            "    else logging.NullHandler()\n"
            ")\n",
        ),
        (  # already on rank 0 only
            'import logging\nif RANK == 0:\n    handler = logging.FileHandler("train.log")\n',
            'if RANK == 0:\n    handler = logging.FileHandler("train.log")\n',
        ),
    ],
    ids=["imported-name", "rotating", "guarded"],
)
def test_the_file_handlers_of_logging(made, chosen):
    source = (
        LOGGER.replace("{extra}", "")
        .replace("{after}", "")
        .replace('logger = Logger("log.txt")\n', made + "logging.getLogger().addHandler(handler)\n")
    )
    converted = convert_source(source, DDP).converted
    assert chosen in converted
    assert "\nimport logging\n" in converted


SUBCLASS = """\
import torch
from torch.utils.tensorboard import SummaryWriter


class Writer(SummaryWriter):
    def log_training(self, loss, step):
        self.add_scalar("train/loss", loss, step)
{extra}

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8
)
writer = Writer("./logs")
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    writer.log_training(loss.item(), step)
"""


@pytest.mark.parametrize(
    "extra, replaced",
    [("", True), ("\n    def last(self):\n        return self.step\n", False)],
    ids=["only-logs", "returns-a-value"],
)
def test_a_summary_writer_of_the_project_is_made_on_rank_zero(extra, replaced):
    """melgan's `MyWriter(SummaryWriter)`: each process wrote its own event file."""
    converted = convert_source(SUBCLASS.replace("{extra}", extra), DDP).converted
    assert "RANK" in converted
    assert ('writer = Writer("./logs") if RANK == 0 else NoWriter()\n' in converted) is replaced


DEFAULT_FOLDER = FIXTURES_DIR / "ddp" / "default_log_dir.py"


def test_a_default_writer_folder_read_by_the_script_is_rank_zeros_everywhere():
    """PyTorch-BYOL (tenth unseen set): the checkpoints go into `writer.log_dir` of a
    `SummaryWriter()`, a folder only rank 0's writer names; the other ranks' `NoWriter()`
    had none (`os.path.join(None, ...)` in the proof). The trainer that makes the writer
    trains: it is no logger, and stays on every rank."""
    options = ConvertOptions(target="ddp", amp="off")
    conversion = convert_source(DEFAULT_FOLDER.read_text(encoding="utf-8"), options, "train.py")
    code = conversion.converted
    assert (
        "        self.writer = with_rank_zero_log_dir(\n"
        "            SummaryWriter() if RANK == 0 else NoWriter()\n"
        "        )\n"
    ) in code
    assert "dist.broadcast_object_list(folder, src=0)" in code
    assert "    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1))\n" in code
    assert [c.line for c in conversion.log.changes if "made on rank 0 only" in c.description] == [
        18
    ]


def test_a_writer_folder_nothing_reads_is_not_broadcast():
    source = DEFAULT_FOLDER.read_text(encoding="utf-8").replace(
        '        self.checkpoints = os.path.join(self.writer.log_dir, "checkpoints")\n',
        '        self.checkpoints = "checkpoints"\n',
    )
    code = convert_source(source, ConvertOptions(target="ddp", amp="off"), "train.py").converted
    assert "SummaryWriter() if RANK == 0 else NoWriter()\n" in code
    assert "with_rank_zero_log_dir" not in code
