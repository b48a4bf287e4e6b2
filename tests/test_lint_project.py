"""Lint reads a file with the local modules it imports: a training step whose loop is in
`train.py` and whose backward pass is in `trainer.py` is a step of `train.py`."""

from __future__ import annotations

import json
from textwrap import dedent

TRAINER = """\
import torch.nn.functional as F


def train_step(net, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    return loss
"""

TRAIN = """\
import torch
from torch.utils.data import DataLoader

from data import Rows
from trainer import train_step

device = torch.device("cuda")
net = torch.nn.Linear(1024, 1024).to(device)  # wide enough for ACC301 at batch 256
opt = torch.optim.SGD(net.parameters(), lr=0.1)
loader = DataLoader(Rows(), batch_size=256, pin_memory=True)
for x, y in loader:
    loss = train_step(net, opt, x.to(device), y.to(device))
"""

# Rows held in memory: worker processes would only copy them (ACC101 stays quiet).
IN_MEMORY = """\
import torch
from torch.utils.data import Dataset


class Rows(Dataset):
    def __init__(self):
        self.rows = [(torch.rand(4), torch.tensor(0)) for _ in range(64)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]
"""

# Rows read from disk on every access: workers would overlap that with the step.
FROM_DISK = """\
import torch
from torch.utils.data import Dataset


class Rows(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.load(f"rows/{index}.pt")
"""


def codes_by_line(cli, *paths: str) -> list[tuple[str, int, str]]:
    run = cli("lint", "--format", "json", "--exit-zero", *paths)
    return [(d["filename"], d["location"]["row"], d["code"]) for d in json.loads(run.stdout)]


def write(tmp_path, **modules: str) -> None:
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)


def test_step_in_an_imported_module_is_a_step_of_the_script(cli, tmp_path):
    write(tmp_path, train=TRAIN, trainer=TRAINER, data=IN_MEMORY)
    assert codes_by_line(cli, "train.py") == [
        ("train.py", 11, "ACC301"),  # the loop: the forward pass is in trainer.py
        ("train.py", 12, "ACC103"),
        ("train.py", 12, "ACC103"),
    ]


def test_a_module_linted_alone_still_reports_its_own_code(cli, tmp_path):
    """trainer.py has no loop of its own: the step is found from train.py only."""
    write(tmp_path, train=TRAIN, trainer=TRAINER, data=IN_MEMORY)
    assert codes_by_line(cli, "trainer.py", "data.py") == []


def test_dataset_of_an_imported_module_decides_workers(cli, tmp_path):
    write(tmp_path, train=TRAIN, trainer=TRAINER, data=FROM_DISK)
    assert ("train.py", 10, "ACC101") in codes_by_line(cli, "train.py")


def test_without_the_imported_module_no_step_is_found(cli, tmp_path):
    """`trainer` is not beside the script: a library, never read (the copies to the GPU
    in a loader loop are still reported)."""
    write(tmp_path, train=TRAIN, data=IN_MEMORY)
    assert codes_by_line(cli, "train.py") == [
        ("train.py", 12, "ACC103"),
        ("train.py", 12, "ACC103"),
    ]


def test_fix_reads_the_imported_modules_too(cli, tmp_path):
    write(tmp_path, train=TRAIN.replace(", pin_memory=True", ""), trainer=TRAINER, data=IN_MEMORY)
    assert cli("lint", "--fix", "--exit-zero", "train.py").exit_code == 0
    assert "pin_memory=torch.cuda.is_available()" in (tmp_path / "train.py").read_text()


def test_an_import_inside_a_loop_is_followed(cli, tmp_path):
    """The import of the step function sits in the loop's body (imports in `for`,
    `while` and `match` bodies were not followed)."""
    inside = TRAIN.replace("from trainer import train_step\n", "").replace(
        "for x, y in loader:\n", "for x, y in loader:\n    from trainer import train_step\n\n"
    )
    write(tmp_path, train=inside, trainer=TRAINER, data=IN_MEMORY)
    assert ("train.py", 10, "ACC301") in codes_by_line(cli, "train.py")


def test_linting_the_script_alone_names_the_imported_module_with_findings(cli, tmp_path):
    """`lint main.py` reports main.py only (Ruff's way), and says that the `solver.py` it
    imports, holding the step, has findings of its own: it used to say "All checks passed!"."""
    (tmp_path / "solver.py").write_text(dedent("""\
        import torch


        def train(model, loader, device, opt):
            for x, y in loader:
                x = x.to(device)
                loss = torch.nn.functional.cross_entropy(model(x), y.to(device))
                opt.zero_grad()
                loss.backward()
                opt.step()
                print(loss.item())
        """))
    (tmp_path / "main.py").write_text(dedent("""\
        import torch
        from torch.utils.data import DataLoader

        from solver import train

        device = torch.device("cuda")
        model = torch.nn.Linear(1024, 1024).to(device)
        train(model, DataLoader(data, batch_size=64, pin_memory=True), device, torch.optim.SGD(model.parameters()))
        """))
    alone = cli("lint", "main.py")
    assert all(line.startswith("main.py:") for line in alone.stdout.splitlines())
    assert (
        "note: solver.py (imported by main.py) has 3 findings not shown; lint it too"
        in alone.stderr
    )
    both = cli("lint", "main.py", "solver.py")
    assert "note:" not in both.stderr and "solver.py:11" in both.stdout


def test_no_note_when_the_imported_module_is_linted_through_its_folder(cli, tmp_path):
    write(tmp_path, train=TRAIN, trainer=TRAINER, data=IN_MEMORY)
    (tmp_path / "lib").mkdir()
    assert "note:" not in cli("lint", "train.py", ".").stderr
