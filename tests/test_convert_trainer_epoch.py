"""F15 of the sixth unseen set (DeepLab's Trainer): fixtures/ddp/trainer_epoch_method.py,
where a Trainer builds its loader and `main()` calls `trainer.training(epoch)` once per
epoch. The sampler's epoch is set on `trainer.train_loader` at the top of main's epoch
loop; before, no name there held the loader, nothing was set, and the proof found every
epoch in the same order. tests/test_convert_verify.py proves the result."""

from __future__ import annotations

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import FIXTURES_DIR

FIXTURE = FIXTURES_DIR / "ddp" / "trainer_epoch_method.py"


def test_the_epoch_is_set_through_the_trainer_the_epoch_loop_calls():
    converted = convert_source(
        FIXTURE.read_text(), ConvertOptions(target="ddp", amp="off"), FIXTURE.name
    ).converted
    assert (
        "    for epoch in range(args.epochs):\n"
        "        if DISTRIBUTED:\n"
        "            trainer.train_loader.sampler.set_epoch(epoch)\n"
        "        trainer.training(epoch)\n"
    ) in converted
