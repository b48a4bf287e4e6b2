"""`--to ddp` of a helper that makes the training and the validation loader in two
branches (fixtures/ddp/loader_by_flag.py): proven, written, and each process validates
on the whole set, so the average printed is the original's."""

from __future__ import annotations

from pathlib import Path

import pytest
from running import _check, run_autoaccel, run_ranks, run_script

pytestmark = pytest.mark.runs

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "loader_by_flag.py"


def first_validation(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("validation loss"))


def test_the_validation_loader_stays_whole_and_its_average_the_originals(tmp_path):
    conversion = run_autoaccel(
        "convert", FIXTURE, "--to", "ddp", "--amp", "off", "-o", "ddp.py", cwd=tmp_path
    )
    _check(conversion, "autoaccel convert loader_by_flag.py --to ddp")
    assert (tmp_path / "ddp.py").exists() and "--verify FAIL" not in conversion.stderr
    original = run_script(FIXTURE, (), tmp_path)
    _check(original, "python loader_by_flag.py")
    ranks = run_ranks(tmp_path / "ddp.py", (), tmp_path)
    _check(ranks, "torchrun ddp.py")
    # the first validation runs before any training step: the same model, the whole set
    assert first_validation(ranks.stdout) == first_validation(original.stdout)
