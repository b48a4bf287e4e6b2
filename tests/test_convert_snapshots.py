"""Snapshot tests: `autoaccel convert` output for every fixture, and its idempotence.

The expected outputs live in tests/snapshots/<fixture>.<variant>.py. After an intended change
to the converter, regenerate them and review the diff:

    AUTOACCEL_UPDATE_SNAPSHOTS=1 pytest tests/test_convert_snapshots.py
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path

import pytest

from running import DDP_OPTIONS, SessionRuns, fixture_names, runs_fixture

SNAPSHOTS_DIR = Path(__file__).resolve().parent / "snapshots"
UPDATE = os.environ.get("AUTOACCEL_UPDATE_SNAPSHOTS") == "1"
FIXTURES = fixture_names()
# Every fixture through `autoaccel convert` in a subprocess, 4 ways: minutes, not unit-test seconds.
pytestmark = pytest.mark.runs
VARIANTS = {
    "default": (),
    "amp-off": ("--amp", "off"),
    "dp": ("--to", "dp", "--amp", "off"),
    "ddp": DDP_OPTIONS,
}


# Conversions refused (exit 1) and written with `--allow-partial`: lstm_lm.py feeds its
# hidden state back into the model, which DataParallel would split along the batch
# (tests/test_convert_dp_shapes.py checks the refusal).
REFUSED = {("lstm_lm.py", "dp")}


def _convert(shared: SessionRuns, name: str, variant: str) -> Path:
    """The variant's conversion (for `ddp` the ddp run tests': it is shared); each snapshot
    also shows that its fixture converts unrefused, but for those in REFUSED."""
    partial = ("--allow-partial",) if (name, variant) in REFUSED else ()
    return shared.convert(name, *VARIANTS[variant], *partial)


def start_runs(shared: SessionRuns, tests: list) -> dict[tuple[str, str], Future]:
    """(fixture, variant) -> future of the converted file, for the selected tests, in the
    background (see running.py); those the run tests made already are done."""
    pairs = {
        (t.callspec.params["name"], t.callspec.params.get("variant", "default")) for t in tests
    }
    return {pair: shared.start(_convert, *pair) for pair in sorted(pairs)}


converted = runs_fixture(start_runs)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", FIXTURES)
def test_convert_matches_snapshot(name, variant, converted):
    actual = converted[name, variant].result().read_text(encoding="utf-8")
    snapshot = SNAPSHOTS_DIR / f"{name.removesuffix('.py')}.{variant}.py"
    if UPDATE:
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_text(actual, encoding="utf-8", newline="")
        print(f"wrote snapshot {snapshot}")
        return
    assert (
        snapshot.is_file()
    ), f"no snapshot {snapshot.name}; create it with AUTOACCEL_UPDATE_SNAPSHOTS=1"
    expected = snapshot.read_text(encoding="utf-8")
    assert actual == expected, (
        f"{name} ({variant}) differs from {snapshot.name}; if the change is intended, "
        "regenerate with AUTOACCEL_UPDATE_SNAPSHOTS=1 and review the diff"
    )


@pytest.mark.parametrize("name", FIXTURES)
def test_convert_is_idempotent(name, converted, cli, tmp_path):
    # `autoaccel convert` in this process: the same command, without a Python start-up.
    first = converted[name, "default"].result()
    second = tmp_path / "again.py"
    assert cli("convert", str(first), "-o", str(second)).exit_code == 0
    assert second.read_text(encoding="utf-8") == first.read_text(encoding="utf-8")
