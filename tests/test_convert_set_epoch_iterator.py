"""`set_epoch` on the loader, never on an iterator of it (fixtures/ddp/iterator_batches.py,
the shape of an unseen GAN solver): `batches = iter(self.loader)` reads the loader's
batches, but `batches.sampler.set_epoch(i)` raised AttributeError on every process."""

from __future__ import annotations

from pathlib import Path

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "iterator_batches.py"


def test_the_epoch_is_set_on_the_loader_not_on_its_iterator() -> None:
    conversion = convert_source(
        FIXTURE.read_text(), ConvertOptions(target="ddp", amp="off"), "iterator_batches.py"
    )
    assert "self.loader.sampler.set_epoch(i)" in conversion.converted
    assert "batches.sampler" not in conversion.converted
