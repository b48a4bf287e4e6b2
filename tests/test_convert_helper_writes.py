"""Issue 29 (a ViT trainer): writes made by a helper of another module, and an epoch's
average that a method returns.

- fixtures/projects/helper_writes: `train.py` hands the run to `records.store_run()`,
  which only writes (JSON files, `torch.save`). `--to ddp` guards the call with
  `if RANK == 0:` and leaves `records.py` as it is; a helper that also calls
  `torch.distributed`, or (`--to fsdp`) is given the sharded model, is refused with the
  line of the call.
- fixtures/ddp/trainer_epoch_average.py: `return total / len(self.loader.dataset)` in a
  method divides by this process's share, `len(self.loader.sampler)`; so does a loader
  passed as a parameter.

tests/test_convert_helper_writes_runs.py runs both under torchrun.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from autoaccel.convert import command
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import FIXTURES_DIR

DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")
PROJECT = FIXTURES_DIR / "projects" / "helper_writes"
EPOCH_AVERAGE = FIXTURES_DIR / "ddp" / "trainer_epoch_average.py"


def copy_project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    shutil.copytree(PROJECT, folder)
    return folder


def test_ddp_runs_a_helper_that_only_writes_on_rank_zero(tmp_path, capsys):
    folder = copy_project(tmp_path)
    assert command.run_convert(folder / "train.py", DDP, output=tmp_path / "out") == 0
    converted = (tmp_path / "out" / "train.py").read_text()
    assert (
        '    if RANK == 0:\n        store_run("runs/regression", settings, net, history)\n'
        in converted
    )
    assert converted.count("if RANK == 0:\n") == 1
    # the helper's module is not rewritten: its writes stay as they were
    assert (tmp_path / "out" / "records.py").read_text() == (PROJECT / "records.py").read_text()
    assert "line 33: ACC403 checkpoint save on rank 0 only" in capsys.readouterr().out


def test_ddp_refuses_a_writing_helper_that_waits_for_every_process(tmp_path, capsys):
    folder = copy_project(tmp_path)
    records = folder / "records.py"
    records.write_text(
        records.read_text()
        .replace("import torch\n", "import torch\nimport torch.distributed as dist\n")
        .replace(
            "    torch.save(",
            "    if dist.is_initialized():\n        dist.barrier()\n    torch.save(",
        )
    )
    assert command.run_convert(folder / "train.py", DDP, output=tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert (
        f"{folder / 'train.py'}:33:1: error: rank-0 checkpoint save not applied: `store_run()`"
        " (records.py:9) writes on every process, and only rank 0 may: it calls"
        " `torch.distributed.barrier`, which every process must call"
    ) in err
    assert not (tmp_path / "out").exists()


def test_fsdp_refuses_a_writing_helper_given_the_sharded_model(tmp_path, capsys):
    folder = copy_project(tmp_path)
    assert command.run_convert(folder / "train.py", FSDP, output=tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert (
        f"{folder / 'train.py'}:33:1: error: rank-0 checkpoint save not applied: `store_run()`"
        " (records.py:8) writes on every process, and only rank 0 may: it is given the"
        " sharded `net`"
    ) in err


def test_a_writing_helper_of_a_module_that_trains_returns_early_there(tmp_path):
    """A module the conversion rewrites guards its own writers: the call stays as it is."""
    (tmp_path / "loop.py").write_text(textwrap.dedent("""\
            import torch
            from torch.utils.data import DataLoader, TensorDataset


            def fit(model):
                loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x, y in loader:
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()


            def keep(model):
                torch.save(model.state_dict(), "model.pt")
            """))
    (tmp_path / "train.py").write_text(
        "import torch\nfrom loop import fit, keep\n\nmodel = torch.nn.Linear(4, 1)\nfit(model)\nkeep(model)\n"
    )
    assert command.run_convert(tmp_path / "train.py", DDP, output=tmp_path / "out") == 0
    assert (
        "if RANK != 0:\n        return  # only rank 0 writes\n"
        in (tmp_path / "out" / "loop.py").read_text()
    )
    assert "\nkeep(model)\n" in (tmp_path / "out" / "train.py").read_text()


def test_an_epoch_average_a_method_returns_divides_by_the_share_of_self_loader():
    result = convert_source(EPOCH_AVERAGE.read_text(), DDP)
    assert "        return total / len(self.loader.sampler)\n" in result.converted
    assert any(
        "divides a sum over this process's shard by its size: `len(self.loader.sampler)`"
        in change.description
        for change in result.log.changes
    )


PASSED_LOADER = """\
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Trainer:
        def __init__(self, model):
            self.model = model
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def train_epoch(self, trainloader):
            total_loss = 0
            for x, y in trainloader:
                self.optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                total_loss += loss.item() * len(x)
            steps = len(trainloader.dataset) // 8
            return total_loss / len(trainloader.dataset), steps


    def main():
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        trainloader = DataLoader(data, batch_size=8, shuffle=True)
        trainer = Trainer(torch.nn.Linear(4, 1))
        for epoch in range(2):
            print(f"epoch {epoch}: {trainer.train_epoch(trainloader)[0]:.4f}")


    main()
"""


def test_an_epoch_average_over_a_loader_parameter_divides_by_its_share():
    """Only the divisor of the training sum changes: a step count keeps the whole set."""
    converted = convert_source(textwrap.dedent(PASSED_LOADER), DDP).converted
    assert "        return total_loss / len(trainloader.sampler), steps\n" in converted
    assert "        steps = len(trainloader.dataset) // 8\n" in converted


def test_a_helper_that_writes_through_another_helper_runs_on_rank_zero(tmp_path):
    """ViT's `save_experiment()` writes JSON, then calls `save_checkpoint()` beside it: a
    call of a function that only writes is a write too."""
    folder = copy_project(tmp_path)
    records = folder / "records.py"
    records.write_text(
        records.read_text().replace(
            '    torch.save(net.state_dict(), os.path.join(folder, "weights.pt"))\n',
            "    store_weights(folder, net)\n\n\ndef store_weights(folder, net):\n"
            "    os.makedirs(folder, exist_ok=True)\n"
            '    torch.save(net.state_dict(), os.path.join(folder, "weights.pt"))\n',
        )
    )
    assert command.run_convert(folder / "train.py", DDP, output=tmp_path / "out") == 0
    converted = (tmp_path / "out" / "train.py").read_text()
    assert (
        '    if RANK == 0:\n        store_run("runs/regression", settings, net, history)\n'
        in converted
    )


def test_an_epoch_average_over_a_loader_of_another_module_divides_by_its_share(tmp_path):
    """ViT's loaders come from `prepare_data()` of its utils module, which the
    conversion gives the DistributedSampler: the divisor in train.py follows it."""
    (tmp_path / "loaders.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def prepare_data():\n"
        "    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "    return DataLoader(data, batch_size=8, shuffle=True)\n"
    )
    script = textwrap.dedent(PASSED_LOADER)
    script = script.replace(
        "from torch.utils.data import DataLoader, TensorDataset\n",
        "\nfrom loaders import prepare_data\n",
    ).replace(
        "    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "    trainloader = DataLoader(data, batch_size=8, shuffle=True)\n",
        "    trainloader = prepare_data()\n",
    )
    (tmp_path / "train.py").write_text(script)
    assert command.run_convert(tmp_path / "train.py", DDP, output=tmp_path / "out") == 0
    converted = (tmp_path / "out" / "train.py").read_text()
    assert "        return total_loss / len(trainloader.sampler), steps\n" in converted
    assert "sampler=sampler" in (tmp_path / "out" / "loaders.py").read_text()
