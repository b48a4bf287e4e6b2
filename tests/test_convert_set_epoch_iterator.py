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


def test_a_new_pass_over_the_loader_gets_a_new_shuffle() -> None:
    """fixtures/ddp/next_batches.py has no epoch loop: batches come from `next()` and the
    iterator is made again in `except StopIteration:`, where the sampler's epoch goes up
    (without it every pass read the order of the first, unlike the original's shuffle)."""
    fixture = FIXTURE.with_name("next_batches.py")
    conversion = convert_source(
        fixture.read_text(), ConvertOptions(target="ddp", amp="off"), "next_batches.py"
    )
    assert (
        "            except StopIteration:\n"
        "                if DISTRIBUTED:\n"
        "                    # a new pass over the data: a new shuffle\n"
        "                    self.loader.sampler.set_epoch(self.loader.sampler.epoch + 1)\n"
        "                batches = iter(self.loader)\n"
    ) in conversion.converted
    assert not [s for s in conversion.log.skipped if s.what == "set_epoch"]
