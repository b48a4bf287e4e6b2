"""Proof by default: `convert --to ddp|fsdp` runs the result before `--write` or `-o FILE`
writes it, writes nothing when the proof fails or the original cannot run, and says in
the report what was proven, or why nothing ran.

The proof itself is faked where only its wiring is tested (each check is tested on records
in tests/test_convert_verify.py, and on runs of the fixtures there); one test runs an
original that stops before its first step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoaccel.convert import command
from autoaccel.convert.verify import Check, VerifyRequest
from autoaccel.run.runner import Run
from running import run_autoaccel

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "summed_loss.py"
PASSED = [
    Check("every process finishes", True, "2 processes, 18 steps each"),
    Check("loss close", True, "1% apart"),
]


@pytest.fixture
def proofs(monkeypatch, tmp_path) -> list[VerifyRequest]:
    """A passing proof in place of the runs: each call's request is kept."""
    (tmp_path / "train.py").write_text(SCRIPT.read_text())
    asked: list[VerifyRequest] = []

    def prove(script, write_conversion, request, import_roots, on_status, original):
        asked.append(request)
        return list(PASSED), ""

    monkeypatch.setattr(command, "verify_ddp", prove)
    return asked


def test_writing_proves_first_and_the_report_lists_the_checks_passed(cli, proofs, tmp_path):
    run = cli(
        "convert", "train.py", "--to", "ddp", "--amp", "off", "-o", "ddp.py", "--", "--epochs", "1"
    )
    assert run.exit_code == 0, run.stderr
    assert [request.script_args for request in proofs] == [["--epochs", "1"]]
    assert (
        "Proven by a run on 2 CPU processes:\n  every process finishes\n  loss close\nRun it:"
        in run.stdout
    )
    assert (tmp_path / "ddp.py").exists()


def test_the_json_report_lists_the_checks_passed(cli, proofs):
    run = cli("convert", "train.py", "--to", "ddp", "--write", "--format", "json")
    assert run.exit_code == 0, run.stderr
    assert json.loads(run.stdout)["proof"] == {
        "proven": [{"check": "every process finishes", "detail": "2 processes, 18 steps each"},
                   {"check": "loss close", "detail": "1% apart"}],
        "not_run": None,
    }  # fmt: skip


def test_a_failed_proof_writes_nothing(cli, monkeypatch, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT.read_text())
    failed = Check("loss close to the original's", False, "50.0% apart")
    monkeypatch.setattr(command, "verify_ddp", lambda *args: ([failed], "the run's output"))
    run = cli("convert", "train.py", "--to", "ddp", "--write")
    assert run.exit_code == 1
    assert "--verify FAIL loss close to the original's: 50.0% apart" in run.stderr
    assert "train.py: error: --verify failed (see above); nothing written" in run.stderr
    assert (tmp_path / "train.py").read_text() == SCRIPT.read_text()


@pytest.mark.parametrize(
    "options, reason",
    [
        ((), "a preview runs nothing; --write or -o FILE runs the proof before writing"),
        (("-o", "-"), "a preview runs nothing"),
        (("--no-verify", "-o", "ddp.py"), "--no-verify: nothing ran it"),
        (("--no-run", "--write"), "--no-run: nothing ran it"),
    ],
    ids=["preview", "stdout", "no-verify", "no-run"],
)
def test_without_a_proof_the_report_says_why(cli, proofs, options, reason):
    run = cli("convert", "train.py", "--to", "ddp", "--amp", "off", *options)
    assert run.exit_code == 0, run.stderr
    assert proofs == []
    assert f"Not proven: {reason}" in run.stdout + run.stderr  # `-o -`: the report on stderr


def test_a_preview_says_in_json_that_it_is_not_proven(cli, proofs):
    run = cli("convert", "train.py", "--to", "fsdp", "--amp", "off", "--format", "json")
    assert run.exit_code == 0 and proofs == []
    not_run = "a preview runs nothing; --write or -o FILE runs the proof before writing (--verify runs it now)"
    assert json.loads(run.stdout)["proof"] == {"proven": [], "not_run": not_run}


def test_other_targets_say_nothing_of_a_proof(cli, proofs):
    run = cli("convert", "train.py", "--amp", "off", "--format", "json", "--no-verify")
    assert run.exit_code == 0 and proofs == [] and "proof" not in json.loads(run.stdout)


@pytest.mark.parametrize("steps, reused", [(20, True), (5, False)])
def test_the_run_for_facts_is_the_originals_run_when_it_took_the_proofs_steps(steps, reused):
    ran = Run({"exit": "max-steps", "losses": [1.0] * steps}, 0, "")
    request = command._with_original(VerifyRequest([], steps=20), ran)
    assert (request.original is ran) is reused


@pytest.mark.runs
def test_an_original_that_cannot_run_here_writes_nothing(tmp_path):
    """It stops before its first step (its data argument is missing): exit 1, its error
    line, what to do, and the script as it was."""
    script = tmp_path / "train.py"
    script.write_text(
        'import sys\nif len(sys.argv) < 2:\n    sys.exit("usage: train.py DATA")\n'
        + SCRIPT.read_text()
    )
    before = script.read_text()
    proc = run_autoaccel(
        "convert", "train.py", "--to", "ddp", "--amp", "off", "--write", cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 1, proc.stderr
    assert (
        "train.py: error: the original script fails here (SystemExit('usage: train.py DATA'))"
        in proc.stderr
    )
    assert "after `--`" in proc.stderr and "--no-verify" in proc.stderr
    assert script.read_text() == before
