"""fixtures/ddp/open_log_file.py: a file opened for writing by an assignment (`log_f =
open(path, "w+")`) and written through its handle. Before, "the file write is part of an
expression" refused it; now the other processes open `os.devnull`, and the proof's check
that one process writes each file passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.verify import VerifyRequest, verify_ddp, write_one

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "open_log_file.py"
DDP = ConvertOptions(target="ddp", amp="off")


def test_the_file_is_opened_on_rank_zero_only():
    conversion = convert_source(FIXTURE.read_text(), DDP, str(FIXTURE))
    assert not [s for s in conversion.log.skipped if s.wrong]
    assert (
        '    log_f = open("training_log.csv","w+") if RANK == 0 else open(os.devnull, "w+")\n'
        in conversion.converted
    )
    assert '    log_f.write("epoch,loss\\n")\n' in conversion.converted  # the handle's uses stay
    assert (
        17,
        "file opened for writing on rank 0 only: the other processes write to os.devnull",
    ) in {(c.line, c.description) for c in conversion.log.changes}
    assert convert_source(conversion.converted, DDP, str(FIXTURE)).converted == conversion.converted


@pytest.mark.parametrize(
    "opened, devnull",
    [
        ('open("training_log.csv")', "open(os.devnull)"),
        ('open("training_log.csv", mode="a")', 'open(os.devnull, "a")'),
    ],
    ids=["no-mode", "mode-keyword"],
)
def test_the_null_file_takes_the_same_mode(opened, devnull):
    """(`open(path)` alone reads: it is no write, and a sibling line writes the file.)"""
    source = FIXTURE.read_text().replace('open("training_log.csv","w+")', opened)
    converted = convert_source(source, DDP, str(FIXTURE)).converted
    assert (f"{opened} if RANK == 0 else {devnull}\n" in converted) == ("mode" in opened)


def proven(fixture: Path, folder: Path, steps: int) -> list:
    """The proof's checks of `fixture`'s conversion (copied into `folder`), all passed."""
    script = folder / "train.py"
    script.write_text(fixture.read_text())
    converted = convert_source(script.read_text(), DDP, str(script)).converted
    found, log = verify_ddp(
        script, write_one(script, converted), VerifyRequest([], steps=steps), [folder]
    )
    assert all(check.passed for check in found), log
    return found


@pytest.mark.runs
def test_one_process_writes_the_log(tmp_path):
    found = proven(FIXTURE, tmp_path, steps=12)
    writes = next(check for check in found if check.name == "one process writes each file")
    assert "training_log.csv" in writes.detail or "1 file(s)" in writes.detail, writes.detail


# -- a handle of `with open(...) as f:` read after the block ---------------------------------
CLOSED_AFTER_WITH = FIXTURE.with_name("closed_after_with.py")


def test_a_close_after_the_with_block_is_guarded_with_it():
    """Eleventh unseen set (SASRec): the `with` went under `if RANK == 0:` and the `f.close()`
    after it did not; rank 1 stopped with a NameError."""
    conversion = convert_source(CLOSED_AFTER_WITH.read_text(), DDP, str(CLOSED_AFTER_WITH))
    assert not [s for s in conversion.log.skipped if s.wrong]
    assert (
        "if RANK == 0:\n"
        '    with open(os.path.join(args.out, "args.txt"), "w") as f:\n'
        '        f.write("\\n".join(f"{k},{v}" for k, v in sorted(vars(args).items())))\n'
        "    f.close()\n"
    ) in conversion.converted
    again = convert_source(conversion.converted, DDP, str(CLOSED_AFTER_WITH)).converted
    assert again == conversion.converted


def test_a_block_reading_the_handle_after_the_with_is_refused():
    source = CLOSED_AFTER_WITH.read_text().replace(
        "f.close()\n", "if not f.closed:\n    f.close()\n"
    )
    conversion = convert_source(source, DDP, str(CLOSED_AFTER_WITH))
    (skip,) = [s for s in conversion.log.skipped if s.wrong]
    assert skip.line == 19 and "which the `with` above binds on rank 0 only" in skip.reason


@pytest.mark.runs
def test_the_settings_file_is_written_once_and_both_processes_train(tmp_path):
    proven(CLOSED_AFTER_WITH, tmp_path, steps=8)
