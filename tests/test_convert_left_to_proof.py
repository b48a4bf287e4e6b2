"""What only a run can tell is left to the proof: a training loop that collects its data
from something the conversion cannot read (an environment of a library: `sensors.read(32)`)
trains each process on its own data if the processes draw differently. The proof's check
"processes train on different data" decides when the proof runs before writing (a preview
says so in a note); `--no-verify` refuses, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoaccel.convert import command
from autoaccel.convert.log import DIFFERENT_DATA, ConvertOptions, left_to_proof, refusals
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.verify import Check

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# fixtures/ddp/rollout_rounds.py with its states read from a library's sensor
SCRIPT = (
    (FIXTURES / "ddp/rollout_rounds.py").read_text()
    .replace("import torch\n", "import sys\n\nimport torch\n\nsys.path.insert(0, 'lib')\nimport sensors\n", 1)
    .replace("    states = torch.randn(32, 4)\n", "    states = sensors.read(32)\n")
)  # fmt: skip
LOOP_LINE = 31  # `for _ in range(3):` of `Agent.update()`
NOTE = (
    f"train.py:{LOOP_LINE}:1: note: DistributedSampler not applied: this training loop trains on all of"
    " its data at every step"
)
DECIDED = "the proof run before writing checks that the processes train on different data"


@pytest.fixture
def proofs(monkeypatch, tmp_path) -> list[Path]:
    """The script in `tmp_path`, a passing proof in place of the runs: the scripts it was asked to prove."""
    (tmp_path / "train.py").write_text(SCRIPT)
    asked: list[Path] = []

    def prove(script, write_conversion, request, import_roots, on_status, original):
        asked.append(script)
        return [
            Check(DIFFERENT_DATA, True, "no DataLoader indices; the processes' losses differ")
        ], ""

    monkeypatch.setattr(command, "verify_ddp", prove)
    return asked


def test_the_refusal_names_the_check_that_decides_it():
    log = convert_source(SCRIPT, ConvertOptions(target="ddp", amp="off"), "train.py").log
    (skip,) = [s for s in log.skipped if s.wrong]
    assert (skip.line, skip.proof) == (LOOP_LINE, DIFFERENT_DATA) and DECIDED in skip.reason
    assert refusals(log.skipped, proof_ahead=False) == [skip] and left_to_proof(
        log.skipped, True
    ) == [skip]
    assert refusals(log.skipped, proof_ahead=True) == []


def test_a_preview_notes_what_the_proof_will_decide(cli, proofs):
    run = cli("convert", "train.py", "--to", "ddp", "--amp", "off")
    assert run.exit_code == 0, run.stderr
    assert NOTE in run.stderr and DECIDED in run.stderr
    assert proofs == []


def test_writing_leaves_it_to_the_proof(cli, proofs, tmp_path):
    run = cli("convert", "train.py", "--to", "ddp", "--amp", "off", "-o", "ddp.py")
    assert run.exit_code == 0, run.stderr
    assert proofs == [Path("train.py")]
    assert f"Proven by a run on 2 CPU processes:\n  {DIFFERENT_DATA}" in run.stdout
    assert NOTE in run.stderr and (tmp_path / "ddp.py").exists()


@pytest.mark.parametrize("unproven", [("--no-verify",), ("--no-run",)], ids=["no-verify", "no-run"])
def test_without_the_proof_it_is_refused(cli, proofs, tmp_path, unproven):
    run = cli("convert", "train.py", "--to", "ddp", "--amp", "off", *unproven, "-o", "ddp.py")
    assert run.exit_code == 1
    assert NOTE.replace("note:", "error:") in run.stderr
    assert not (tmp_path / "ddp.py").exists() and proofs == []


@pytest.mark.runs
def test_the_proof_writes_it_when_each_process_collects_its_own(cli, tmp_path):
    """The sensor draws from torch's stream, which the conversion seeds per process: the
    processes' losses differ, and the result is written, proven."""
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "sensors.py").write_text(
        "import torch\n\n\ndef read(n):\n    return torch.randn(n, 4)\n"
    )
    run = cli("convert", "train.py", "--to", "ddp", "--amp", "off", "-o", "ddp.py")
    assert run.exit_code == 0, run.stderr
    assert (
        f"Proven by a run on 2 CPU processes:\n  every process finishes\n  {DIFFERENT_DATA}\n"
        in run.stdout
    )
    assert (tmp_path / "ddp.py").exists()
