"""`convert --to ddp|fsdp` of a project with a class the run never builds (REPORT F10):
fixtures/facts/unrun_trainer/, where main.py builds the trainer `--trainer` names from a
registry, and `SeqTrainer` (seq_trainer.py) is registered but not built by this run.
Its loop's refusals become notes where the facts of a run show nothing of the class; a
class that ran keeps its refusals.

The facts are the recorder's snapshot (tests/snapshots/facts/unrun_trainer/main.json; the
test that it is current is in tests/test_facts_convert_runs.py).
"""

from __future__ import annotations

import hashlib

import pytest
from test_facts import DDP, FACTS_FIXTURES, FSDP, snapshot

from autoaccel.convert import command
from autoaccel.convert.finish import EXIT_CHANGED
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.facts.model import Printed, Site
from autoaccel.facts.resolve import ConversionFacts
from autoaccel.fileio import read_source
from autoaccel.run.facts import FactsRequest, FactsRun

NAME = "unrun_trainer/main"
NEVER_BUILT = "left as it is (the run never built `SeqTrainer`): "


def skipped(options, facts=None) -> dict:
    """The skipped items of each file's conversion (by file name), with `facts`."""
    script = FACTS_FIXTURES / f"{NAME}.py"
    project = find_project(script, read_source(script))
    assert project is not None
    given = None if facts is None else ConversionFacts(facts, script, project.script.source.text)
    result = convert_project(project, options, str(script), given)
    return {f.file.path.name: f.conversion.log.skipped for f in result.files}


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_refusals_in_a_class_the_run_never_built_become_notes(options):
    files = skipped(options, snapshot(NAME)[0])
    unbuilt = files["seq_trainer.py"]
    assert [s.wrong for s in unbuilt] == [False] * 3
    assert all(s.reason.startswith(NEVER_BUILT) for s in unbuilt)
    assert {s.line for s in unbuilt} == {None, 16}  # the module's, and its loop's
    # SimpleTrainer ran: its own refusal (its loader comes through the registry) stays
    assert [s.wrong for s in files["trainer.py"]] == [True]
    assert NEVER_BUILT not in files["trainer.py"][0].reason


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_without_a_run_the_class_is_refused(options):
    unbuilt = skipped(options)["seq_trainer.py"]
    assert unbuilt and all(s.wrong for s in unbuilt)


def test_a_run_that_recorded_a_site_in_the_class_keeps_its_refusals():
    """A site of the run in `SeqTrainer` (a print of its `__init__`, say) shows it built."""
    facts = snapshot(NAME)[0]
    path = FACTS_FIXTURES / "unrun_trainer" / "seq_trainer.py"
    facts.prints.append(Printed(Site(str(path), 12, 8, 12, 26), 1))
    facts.files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    unbuilt = skipped(DDP, facts)["seq_trainer.py"]
    assert unbuilt and all(s.wrong for s in unbuilt)


def test_the_command_converts_with_the_facts_of_its_run(monkeypatch, capsys):
    """`convert` as the command runs it (a static conversion, then one with the facts):
    a later step asks the facts of a tree an earlier step resolved (no internal error)."""
    facts = snapshot(NAME)[0]
    monkeypatch.setattr(command, "collect_facts", lambda path, request: FactsRun(facts, 0.1))
    script = FACTS_FIXTURES / f"{NAME}.py"
    code = command.run_convert(script, ConvertOptions(target="ddp"), facts=FactsRequest([]))
    out, err = capsys.readouterr()
    assert "internal error" not in err, err
    assert code == EXIT_CHANGED  # refused for trainer.py's loader alone
    assert "seq_trainer.py:16:1: error" not in err
    assert "line 16: DistributedDataParallel not applied: " + NEVER_BUILT in out
