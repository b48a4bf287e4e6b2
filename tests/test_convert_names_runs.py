"""Scripts that use names the conversion inserts train right under torchrun (2 processes,
gloo, CPU): the conversion's code gets free names, the script keeps its own."""

from __future__ import annotations

from textwrap import dedent

import pytest

from running import _check, run_autoaccel, run_ranks

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

TRAINS = dedent("""\
    import torch
    from torch.utils.data import DataLoader
    {extra}
    torch.manual_seed(0)
    loader = DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for (x,) in loader:
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    {after}
    """)


def convert_and_run(tmp_path, extra: str, after: str) -> str:
    """Convert the script to ddp and run it on two processes; rank 0's output."""
    (tmp_path / "train.py").write_text(TRAINS.format(extra=extra, after=after))
    conversion = run_autoaccel(
        "convert",
        "train.py",
        "--to",
        "ddp",
        "--amp",
        "off",
        "-o",
        "ddp.py",
        "--no-verify",
        cwd=tmp_path,
    )
    _check(conversion, "autoaccel convert train.py --to ddp")
    run = run_ranks(tmp_path / "ddp.py", (), tmp_path)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_names_from_a_star_import_keep_their_values(tmp_path):
    (tmp_path / "settings.py").write_text("RANK = 3\nWORLD_SIZE = 16\n")
    out = convert_and_run(tmp_path, "from settings import *", "print('settings', RANK, WORLD_SIZE)")
    assert out.split().count("settings") == 1 and "settings 3 16" in out


def test_the_scripts_own_nowriter_is_left_alone(tmp_path):
    """Rank 1 gets the conversion's `NoWriter()` in place of the run, while the
    script's own `NoWriter` (which takes an argument) stays the script's."""
    (tmp_path / "wandb.py").write_text(
        "class Run:\n    def log(self, data):\n        pass\n\n\ndef init(**kwargs):\n    return Run()\n"
    )
    extra = "import wandb\n\n\nclass NoWriter:\n    def __init__(self, path):\n        self.path = path\n"
    after = "run = wandb.init(project='demo')\nrun.log({'loss': loss.item()})\nprint('mine', NoWriter('p').path)"
    out = convert_and_run(tmp_path, extra, after)
    assert "NoWriter2()" in (tmp_path / "ddp.py").read_text()
    assert "mine p" in out


def test_torch_distributions_as_dist_keeps_working(tmp_path):
    out = convert_and_run(
        tmp_path,
        "import torch.distributions as dist",
        "print('mean', dist.Normal(3.0, 1.0).mean.item())",
    )
    assert "mean 3.0" in out
