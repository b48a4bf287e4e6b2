"""`convert --to ddp|fsdp` of a script whose epoch is a helper of another module:
`utils.train_epoch(loader, model, criterion, optimizer)` loops, steps and runs the forward
pass of a model that train.py builds from a configuration looked up by name, which only
the run shows to be the trained model (fixtures/facts/epoch_helper/; the recorder's
snapshot is tests/snapshots/facts/epoch_helper/train.json, checked current by
tests/test_facts_convert_runs.py).
"""

from __future__ import annotations

import json
import shutil

from test_facts import FACTS_FIXTURES, SNAPSHOTS, absolute, wrong

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.facts.model import RunFacts
from autoaccel.facts.resolve import ConversionFacts
from autoaccel.fileio import read_source

FIXTURE = FACTS_FIXTURES / "epoch_helper"
FACTS = SNAPSHOTS / "epoch_helper" / "train.json"


def converted(target: str, root=FIXTURE.parent.parent.parent):
    """The project conversion (`--amp bf16`, the default) of the fixture under `root` with
    the run's facts, each file's conversion by name. It checks that converting the result
    again changes nothing."""
    script = root / "fixtures" / "facts" / "epoch_helper" / "train.py"
    project = find_project(script, read_source(script))
    assert project is not None  # `import utils`: a project
    run = RunFacts.from_json(absolute(json.loads(FACTS.read_text()), root))
    facts = ConversionFacts(run, script, project.script.source.text)
    result = convert_project(project, ConvertOptions(target=target), str(script), facts)
    return {f.file.path.name: f.conversion for f in result.files}


def test_ddp_autocasts_the_forward_pass_the_run_shows_in_the_helper():
    """The first conversion knows `model(x)` of the helper for a model call from the run,
    as the second one knows `ddp_model(x)` from its DDP wrapper: both add autocast (no
    "a step is not idempotent" internal error)."""
    utils = converted("ddp")["utils.py"]
    assert wrong(utils) == []
    assert (
        "            enabled=torch.cuda.is_available(),\n"
        "        ):\n"
        "            output = ddp_model(x)\n"
        "            loss = criterion(output, y)\n"
        "        optimizer.zero_grad()\n"
    ) in utils.converted
    assert any(c.code == "ACC301" for c in utils.log.changes)


def test_fsdp_refuses_to_shard_in_the_helper_each_epoch_calls():
    """`fully_shard` in `train_epoch()` would shard the sharded model again every epoch
    (and after the caller built the optimizer): refused, with why."""
    files = converted("fsdp")
    [reason] = wrong(files["utils.py"])
    assert "`train_epoch()` receives `model` and is called in a loop of train.py" in reason
    assert "call `fully_shard(model)` once where it is built" in reason
    assert "shard_model(model)" not in files["utils.py"].converted


def test_fsdp_refuses_to_shard_in_a_helper_called_once_after_the_optimizer(tmp_path):
    """Called once, after train.py built the optimizer from the model's parameters: that
    optimizer would keep the parameters as they were before sharding. (The fixture is
    copied where the snapshot's relative paths land under `tmp_path`.)"""
    project = tmp_path / "fixtures" / "facts" / "epoch_helper"
    shutil.copytree(FIXTURE, project)
    script = project / "train.py"
    script.write_text(script.read_text().replace(
        "for epoch in range(args.epochs):\n", "epoch = 0\nif args.epochs:\n"
    ))  # fmt: skip
    [reason] = wrong(converted("fsdp", tmp_path)["utils.py"])
    assert "steps the optimizer `optimizer` its caller built" in reason
