"""`--to ddp` of a helper that makes the training and the validation loader in two
branches (fixtures/ddp/loader_by_flag.py), or of a factory that makes every split's loader
by its `flag` (fixtures/ddp/loader_factory_split.py): proven, written, and each process
validates on the whole set, so the average printed is the original's."""

from __future__ import annotations

from pathlib import Path

import pytest
from running import _check, run_autoaccel, run_ranks, run_script

pytestmark = pytest.mark.runs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ddp"


def first_validation(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("validation loss"))


@pytest.mark.parametrize("name", ["loader_by_flag.py", "loader_factory_split.py"])
def test_the_validation_loader_stays_whole_and_its_average_the_originals(tmp_path, name):
    fixture = FIXTURES / name
    conversion = run_autoaccel(
        "convert", fixture, "--to", "ddp", "--amp", "off", "-o", "ddp.py", cwd=tmp_path
    )
    _check(conversion, f"autoaccel convert {name} --to ddp")
    assert (tmp_path / "ddp.py").exists() and "--verify FAIL" not in conversion.stderr
    original = run_script(fixture, (), tmp_path)
    _check(original, f"python {name}")
    ranks = run_ranks(tmp_path / "ddp.py", (), tmp_path)
    _check(ranks, "torchrun ddp.py")
    # the first validation runs before any training step: the same model, the whole set
    assert first_validation(ranks.stdout) == first_validation(original.stdout)
