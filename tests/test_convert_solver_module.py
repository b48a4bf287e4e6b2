"""S23 of the fifth unseen set (Conv-TasNet): fixtures/facts/solver_module/, where train.py
wraps the model in `nn.DataParallel` and a solver class of solver.py saves
`self.model.module`. `--to ddp` removes the wrapper (DDP wraps the model where it trains),
so `self.model.module` becomes `self.model` in solver.py too; before, only the script's
own `model.module` did, and the proof failed with an AttributeError.
tests/test_convert_solver_module_runs.py proves the result."""

from __future__ import annotations

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.fileio import read_source
from running import FIXTURES_DIR

SCRIPT = FIXTURES_DIR / "facts" / "solver_module" / "train.py"
DDP = ConvertOptions(target="ddp", amp="off")


def test_the_solver_saves_the_model_the_wrapper_held():
    project = find_project(SCRIPT, read_source(SCRIPT))
    assert project is not None
    texts = {
        f.file.path.name: f.conversion.converted
        for f in convert_project(project, DDP, str(SCRIPT)).files
    }
    assert "torch.nn.DataParallel(" not in texts["train.py"]
    assert (
        '                torch.save(self.model.state_dict(), "final.pth")\n' in texts["solver.py"]
    )


OWN_MODULE = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.module = nn.Linear(8, 1)

    def forward(self, x):
        return self.module(x)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 8)))
for (x,) in loader:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
print(model.module.weight)
"""


def test_a_model_with_a_module_of_its_own_keeps_it():
    converted = convert_source(OWN_MODULE, DDP, "train.py").converted
    assert "print(model.module.weight)" in converted
