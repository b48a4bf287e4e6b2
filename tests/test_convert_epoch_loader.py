"""`set_epoch` on a loader built anew every epoch (fixtures/ddp/loader_per_epoch.py, the
shape of an unseen recommender's trainer): `train_loader = make_loader(...)` in the epoch
loop, then `train_an_epoch(..., train_loader, epoch)`. The call went to the top of the
epoch loop, before the loader exists (NameError on every process), or, the loader being
a local of `main()`, nowhere."""

from __future__ import annotations

import textwrap
from pathlib import Path

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "loader_per_epoch.py"
DDP = ConvertOptions(target="ddp", amp="off")


def test_the_epoch_is_set_right_after_the_loader_is_built() -> None:
    conversion = convert_source(FIXTURE.read_text(), DDP, FIXTURE.name)
    assert (
        "        train_loader = make_loader(2, 16)\n"
        "        if DISTRIBUTED:\n"
        "            train_loader.sampler.set_epoch(epoch)\n"
        "        train_an_epoch(ddp_model, optimizer, train_loader, epoch)\n"
    ) in conversion.converted
    assert not [s for s in conversion.log.skipped if s.what == "set_epoch"]


def test_a_loader_built_at_top_level_in_the_epoch_loop() -> None:
    """The loader a global of the script, assigned in its epoch loop after a print."""
    source = textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


        def train_an_epoch(loader):
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()


        for epoch in range(3):
            print("epoch", epoch)
            train_loader = DataLoader(
                TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True
            )
            train_an_epoch(train_loader)
        """)
    converted = convert_source(source, DDP, "train.py").converted
    assert (
        "    )\n"
        "    if DISTRIBUTED:\n"
        "        train_loader.sampler.set_epoch(epoch)\n"
        "    train_an_epoch(train_loader)\n"
    ) in converted


def test_each_pass_of_a_while_loop_over_iterations_reshuffles() -> None:
    """fixtures/ddp/iteration_passes.py (pytorch-semseg's shape): no epoch variable; every
    pass of the `while` tells the sampler the next epoch. Before, no set_epoch was added
    (the proof found every pass in the same order)."""
    fixture = FIXTURE.parent / "iteration_passes.py"
    conversion = convert_source(fixture.read_text(), DDP, fixture.name)
    assert (
        "    while i < max_iters and running:\n"
        "        if DISTRIBUTED:\n"
        "            # a new pass over the data: a new shuffle\n"
        "            loader.sampler.set_epoch(loader.sampler.epoch + 1)\n"
        "        for xb, yb in loader:\n"
    ) in conversion.converted
    assert not [s for s in conversion.log.skipped if s.what == "set_epoch"]
