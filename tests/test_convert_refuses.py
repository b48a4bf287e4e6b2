"""`--to ddp` fails closed: a result that would train wrongly is not written."""

from __future__ import annotations

from textwrap import dedent

import pytest

from test_convert_names import TRAINS

NO_LOADER = dedent("""\
    import torch

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(64, 4)
    start = 0
    while start < 64:
        loss = model(data[start:start + 16]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        start += 16
    """)


def test_unsharded_training_data_is_refused_and_nothing_written(cli, tmp_path):
    (tmp_path / "train.py").write_text(NO_LOADER)
    run = cli("convert", "train.py", "--to", "ddp", "-o", "ddp.py")
    assert run.exit_code == 1
    assert (
        "train.py:7:1: error: DistributedSampler not applied: this training loop walks its data"
        in run.stderr
    )
    assert "--to ddp refused" in run.stderr and "--allow-partial" in run.stderr
    assert not (tmp_path / "ddp.py").exists()


def test_allow_partial_writes_with_warnings(cli, tmp_path):
    (tmp_path / "train.py").write_text(NO_LOADER)
    run = cli(
        "convert", "train.py", "--to", "ddp", "--allow-partial", "-o", "ddp.py", "--no-verify"
    )
    assert run.exit_code == 0, run.stderr
    assert "train.py:7:1: warning: DistributedSampler not applied" in run.stderr
    assert "DISTRIBUTED" in (tmp_path / "ddp.py").read_text()


def test_single_process_target_is_not_refused(cli, tmp_path):
    (tmp_path / "train.py").write_text(NO_LOADER)
    run = cli("convert", "train.py", "-o", "fast.py")
    assert run.exit_code == 0, run.stderr
    assert (tmp_path / "fast.py").exists()


def test_training_loop_in_a_local_module_is_named_with_its_line(cli, tmp_path):
    """minGPT's shape: the script builds the objects, `mingpt/trainer.py` trains. The
    conversion goes into lib/trainer.py, where a loader built inside the `for` cannot get
    a sampler: refused with that file's line, and no file written."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "trainer.py").write_text(dedent("""\
            from torch.utils.data import DataLoader


            class Trainer:
                def __init__(self, model, optimizer, dataset):
                    self.model, self.optimizer, self.dataset = model, optimizer, dataset

                def run(self):
                    for x, y in DataLoader(self.dataset, batch_size=8, shuffle=True):
                        loss = (self.model(x) - y).pow(2).mean()
                        self.optimizer.zero_grad()
                        loss.backward()
                        self.optimizer.step()
            """))
    (tmp_path / "train.py").write_text(dedent("""\
            import torch
            from lib.trainer import Trainer

            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            dataset = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
            Trainer(model, optimizer, dataset).run()
            """))
    run = cli("convert", "train.py", "--to", "ddp", "--write")
    assert run.exit_code == 1
    assert "lib/trainer.py:9:1: error: DistributedSampler not applied" in run.stderr
    assert "import os" not in (tmp_path / "train.py").read_text()
    assert "import os" not in (tmp_path / "lib" / "trainer.py").read_text()


@pytest.mark.parametrize(
    ("extra", "fresh"),
    [
        ("RANK = 3", "RANK2"),
        ("WORLD_SIZE = 1", "WORLD_SIZE2"),
        ("DISTRIBUTED = False", "DISTRIBUTED2"),
        ("import torch.distributions as dist", "torch_dist"),
        ("ddp_model = 'mine'", "ddp_model2"),
    ],
)
def test_a_name_the_conversion_defines_is_never_taken_over(cli, tmp_path, extra, fresh):
    """A script's own `RANK` or `dist` would be silently rebound (issue: loss 1.2275 ->
    0.3724 under plain python); the conversion's own gets a free name instead."""
    (tmp_path / "train.py").write_text(TRAINS.format(extra=extra))
    run = cli("convert", "train.py", "--to", "ddp", "-o", "ddp.py", "--no-verify")
    assert run.exit_code == 0, run.stderr
    code = (tmp_path / "ddp.py").read_text()
    assert extra in code and (f"{fresh} = " in code or f"as {fresh}" in code)


def test_the_sampler_gets_a_name_the_script_does_not_use(cli, tmp_path):
    (tmp_path / "train.py").write_text(TRAINS.format(extra="sampler = 'mine'"))
    run = cli("convert", "train.py", "--to", "ddp", "-o", "ddp.py", "--no-verify")
    assert run.exit_code == 0, run.stderr
    code = (tmp_path / "ddp.py").read_text()
    assert "sampler = 'mine'" in code and "sampler=sampler2" in code


STREAM = dedent("""\
    import torch
    from torch.utils.data import DataLoader, IterableDataset


    class Stream(IterableDataset):
        def __iter__(self):
            for _ in range(16):
                yield torch.randn(4)


    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in DataLoader(Stream(), batch_size=4):
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


def test_a_stream_gets_no_workers_and_no_sampler(cli, tmp_path):
    """Workers would each replay the whole stream (16 samples an epoch -> 16 x workers),
    and DistributedSampler rejects an IterableDataset on every rank."""
    (tmp_path / "train.py").write_text(STREAM)
    single = cli("convert", "train.py", "-o", "fast.py")
    assert single.exit_code == 0, single.stderr
    assert "num_workers" not in (tmp_path / "fast.py").read_text()
    assert "IterableDataset: every worker would yield the whole stream" in single.stdout
    # --to ddp splits it by process and by worker instead (tests/test_convert_tensor_data.py)
    ddp = cli("convert", "train.py", "--to", "ddp", "-o", "ddp.py", "--no-verify")
    assert ddp.exit_code == 0, ddp.stderr
    assert (
        "DataLoader(ShardedStream(Stream()), batch_size=per_process_batch_size(4))"
        in (tmp_path / "ddp.py").read_text()
    )


def test_check_fails_a_refused_conversion(cli, tmp_path):
    """`--check` in CI: a result that would train wrongly is a failure like a change."""
    (tmp_path / "train.py").write_text(NO_LOADER)
    run = cli("convert", "train.py", "--to", "ddp", "--check")
    assert run.exit_code == 1 and "--to ddp refused" in run.stderr


@pytest.mark.parametrize(
    "step, line, what",
    [
        ("    loss = criterion(model(x), y) + model(x).pow(2).mean()\n", 12, "summed loss"),
        ("    loss = criterion(model(x), y) * 256 / batch_size\n", 10, "per-process batch"),
    ],
    ids=["sum-and-mean", "batch-size-in-the-loss"],
)
def test_what_ddp_cannot_fix_is_refused_with_its_line(cli, tmp_path, step, line, what):
    script = dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        batch_size = 16
        model = torch.nn.Linear(4, 2)
        criterion = torch.nn.MSELoss(reduction="sum")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=batch_size)
        for x, y in loader:
            STEP
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """).replace("    STEP\n", step)
    (tmp_path / "train.py").write_text(script)
    run = cli("convert", "train.py", "--to", "ddp", "-o", "ddp.py")
    assert run.exit_code == 1
    assert f"train.py:{line}:1: error: {what} not applied" in run.stderr
    assert not (tmp_path / "ddp.py").exists()
