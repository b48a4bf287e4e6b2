"""Where `convert --to ddp|fsdp` puts a project's changes when the epoch loop, the batch
loop and the loader live in three files (fixtures/projects/epoch_helper_loop: `main()`
in train.py builds the model and its optimizer and calls `loops.run_epoch()` once per
epoch; data.py builds the loader): `set_epoch` at the top of `main()`'s epoch loop, the
model wrapped or sharded once where `main()` builds it (before its optimizer), and the
helper module importing `torch` where inserted code reads it."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from running import FIXTURES_DIR

EPOCH_HELPER = FIXTURES_DIR / "projects" / "epoch_helper_loop"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    copy = tmp_path / "epoch_helper_loop"
    shutil.copytree(EPOCH_HELPER, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(copy)
    return copy


def converted(target: str, tmp_path: Path) -> dict[str, str]:
    out = tmp_path / target
    assert (
        command.run_convert(Path("train.py"), ConvertOptions(target=target, amp="off"), output=out)
        == 0
    )
    return {name: (out / name).read_text() for name in ("train.py", "loops.py", "data.py")}


SET_EPOCH = "    for epoch in range(2):\n        if DISTRIBUTED:\n            loader.sampler.set_epoch(epoch)\n"


def test_ddp_wraps_once_where_main_builds_the_model(project, tmp_path):
    files = converted("ddp", tmp_path)
    train = files["train.py"]
    built = train.index("    net = nn.Sequential(")
    assert (
        built
        < train.index("    ddp_net = net\n    if DISTRIBUTED:\n        ddp_net = DDP(")
        < train.index("    optimizer =")
    )
    assert SET_EPOCH + "        run_epoch(ddp_net, loader, optimizer, epoch)\n" in train
    assert (
        '{"net": net.state_dict(), "optimizer": optimizer.state_dict()}' in train
    )  # the bare model's keys
    assert "DDP" not in files["loops.py"] and "set_epoch" not in files["loops.py"]


def test_fsdp_shards_once_before_main_builds_the_optimizer(project, tmp_path):
    files = converted("fsdp", tmp_path)
    train = files["train.py"]
    shard = train.index("    if DISTRIBUTED:\n        shard_model(net)\n")
    assert (
        train.index("    net = nn.Sequential(")
        < shard
        < train.index("    optimizer = torch.optim.SGD(")
    )
    assert SET_EPOCH + "        run_epoch(net, loader, optimizer, epoch)\n" in train
    assert (
        "    net_state = full_state_dict(net)\n    optimizer_state = full_optimizer_state_dict(net, optimizer)\n"
        in train
    )
    assert "shard_model" not in files["loops.py"]


def test_converting_the_result_again_changes_nothing(project, tmp_path, capsys):
    for target in ("ddp", "fsdp"):
        files = converted(target, tmp_path)
        again = tmp_path / f"{target}-again"
        shutil.copytree(tmp_path / target, again)
        for name, text in files.items():
            assert (again / name).read_text() == text
        capsys.readouterr()
        assert (
            command.run_convert(
                again / "train.py", ConvertOptions(target=target, amp="off"), check=True
            )
            == 0
        )


def test_fsdp_imports_torch_in_a_module_that_shards_without_it(tmp_path, monkeypatch):
    """trainer.py builds the optimizer itself, so the model is sharded there; it imports
    `torch.nn.functional` and `torch.optim` only, while `shard_model()` reads `torch.nn`."""
    (tmp_path / "trainer.py").write_text(textwrap.dedent("""\
        import torch.nn.functional as F
        from torch.optim import SGD


        class Trainer:
            def __init__(self, model, loader):
                self.model = model
                self.loader = loader
                self.opt = SGD(model.parameters(), lr=0.1)

            def fit(self, epochs):
                for epoch in range(epochs):
                    for x, y in self.loader:
                        self.opt.zero_grad()
                        F.cross_entropy(self.model(x), y).backward()
                        self.opt.step()
        """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        from trainer import Trainer

        x = torch.randn(64, 4)
        loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8, shuffle=True)
        Trainer(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), loader).fit(2)
        """))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert (
        command.run_convert(Path("train.py"), ConvertOptions(target="fsdp", amp="off"), output=out)
        == 0
    )
    files = (out / "trainer.py").read_text()
    assert "        shard_model(self.model)\n" in files
    assert files.startswith("import os\n\nimport torch\nimport torch.nn.functional as F\n")
