"""S22 of the fifth unseen set: fixtures/facts/cached_dataset/, whose project dataset
(points.py) makes its data once and caches it with `torch.save` in `__init__`, among other
work, then loads the cache. `--to fsdp` now converts points.py as `--to ddp` does: rank 0
writes the cache, every rank waits at a barrier before it loads it. Before, fsdp left the
module alone, taking every save of a checkpointing helper for a save of the sharded
model; only a helper given a trained model needs every process to gather its state.
tests/test_convert_cached_dataset_runs.py proves the fsdp result."""

from __future__ import annotations

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.fileio import read_source
from running import FIXTURES_DIR

SCRIPT = FIXTURES_DIR / "facts" / "cached_dataset" / "main.py"


def converted_dataset(target: str) -> str:
    project = find_project(SCRIPT, read_source(SCRIPT))
    assert project is not None
    result = convert_project(project, ConvertOptions(target=target, amp="off"), str(SCRIPT))
    texts = {f.file.path.name: f.conversion.converted for f in result.files}
    return texts["points.py"]


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_rank_zero_writes_the_cache_and_every_rank_loads_it_after_a_barrier(target):
    assert (
        "            if RANK == 0:\n"
        "                torch.save((x, y), path)\n"
        '                print("Done!")\n'
        "        if DISTRIBUTED:\n"
        "            dist.barrier()  # rank 0 may still be writing it\n"
    ) in converted_dataset(target)


def test_fsdp_converts_the_dataset_module_as_ddp_does():
    assert converted_dataset("fsdp") == converted_dataset("ddp")
