"""A DataLoader subclass of the project (Conv-TasNet's `AudioDataLoader`, unseen set
bench31): when its `__init__` hands `*args, **kwargs` to DataLoader's, a call of it takes
a DistributedSampler like DataLoader's (fixtures/ddp/loader_subclass.py; its `--verify`
run is in tests/test_convert_verify.py); before, it was refused as "an object of the
project's class". One that builds DataLoader's arguments itself takes no sampler: every
process shuffles alike and trains on every WORLD_SIZE-th of its batches
(tests/test_convert_batch_rounds.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "loader_subclass.py"
DDP = ConvertOptions(target="ddp", amp="off")
FORWARDING = """    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
"""


def convert(replace: tuple[str, str] = ("", "")):
    source = FIXTURE.read_text(encoding="utf-8")
    assert replace[0] in source
    return convert_source(source.replace(*replace), DDP, "loader_subclass.py")


def test_a_forwarding_subclass_takes_the_sampler() -> None:
    conversion = convert()
    assert [s for s in conversion.log.skipped if s.wrong] == []
    assert (
        "    sampler = DistributedSampler(dataset, shuffle=True) if DISTRIBUTED else None\n"
        "    loader = StackingLoader(\n"
        "        dataset,\n"
        "        batch_size=per_process_batch_size(8),\n"
        "        shuffle=sampler is None,\n"
        "        sampler=sampler,\n"
        "    )\n"
    ) in conversion.converted
    assert "            loader.sampler.set_epoch(epoch)\n" in conversion.converted


@pytest.mark.parametrize(
    "init",
    [
        "    def __init__(self, dataset, batch_size):\n"
        "        super().__init__(dataset, batch_size, shuffle=True)\n",
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__(*args, shuffle=True)\n",
    ],
    ids=["own-arguments", "drops-kwargs"],
)
def test_a_subclass_that_does_not_pass_every_argument_shares_its_batches(init: str) -> None:
    conversion = convert((FORWARDING, init))
    assert [s for s in conversion.log.skipped if s.wrong] == []
    assert "DistributedSampler(" not in conversion.converted
    assert (
        "    loader = ShardedBatches(StackingLoader(dataset, batch_size=8, shuffle=True))\n"
        in conversion.converted
    )
