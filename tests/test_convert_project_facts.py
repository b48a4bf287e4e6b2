"""`convert --to ddp|fsdp` of a script with the modules of its project, with facts from a
short run (`autoaccel.facts`): the loop in `train.py`, the step `mylib.train_step(model,
opt, x, y)` in a module of the project (fixtures/facts/step_module/).

The facts are the recorder's snapshot (tests/snapshots/facts/step_module/train.json; the
test that it is current, and the two-rank runs of the results, are in
tests/test_facts_convert_runs.py).
"""

from __future__ import annotations

import json
import shutil

import pytest
from test_facts import DDP, FACTS_FIXTURES, FSDP, SNAPSHOTS, absolute, snapshot, wrong

from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.convert.transforms.distributed._base import ddp_name
from autoaccel.facts.model import RunFacts
from autoaccel.facts.resolve import ConversionFacts
from autoaccel.fileio import read_source

STEP_MODULE = "step_module/train"


def converted(
    options, with_facts=True, script=FACTS_FIXTURES / "step_module" / "train.py", facts=None
):
    """The project conversion of `script` (the step_module fixture by default), with the
    fixture's facts (or `facts`) unless `with_facts` is False."""
    project = find_project(script, read_source(script))
    assert project is not None  # `import mylib`: a project
    if with_facts:
        facts = facts or snapshot(STEP_MODULE)[0]
        given = ConversionFacts(facts, script, project.script.source.text)
    else:
        given = None
    result = convert_project(project, options, str(script), given)
    return result.files[0].conversion, [f.file.path.name for f in result.changed]


def test_the_step_in_another_module_is_refused_without_facts():
    conversion, _ = converted(DDP, with_facts=False)
    assert any("no trained model was recognised" in r for r in wrong(conversion))


def test_facts_wrap_the_model_passed_to_the_step_of_another_module():
    conversion, changed = converted(DDP)
    assert wrong(conversion) == []
    assert changed == ["train.py"]  # mylib.py runs the wrapper as it is
    text = conversion.converted
    assert (
        "nn.Linear(16, 1))\n# trained through DDP when distributed" in text
    )  # after `model = ...`
    assert "        total += mylib.train_step(ddp_model, opt, x, y)\n" in text
    assert "sampler = DistributedSampler(dataset, shuffle=False) if DISTRIBUTED else None" in text
    assert "    if RANK == 0:\n        torch.save(" in text
    assert any(
        "the training function receives `ddp_model`" in c.description
        for c in conversion.log.changes
    )


def test_facts_shard_the_model_passed_to_the_step_of_another_module():
    conversion, _ = converted(FSDP)
    assert wrong(conversion) == []
    assert "if DISTRIBUTED:\n    shard_model(model)\nopt = torch.optim.SGD(" in conversion.converted
    assert "mylib.train_step(model, opt, x, y)" in conversion.converted


def test_a_step_that_does_more_with_the_model_than_call_it_is_refused(tmp_path):
    """`mylib.train_step` also reads `model.state_dict()`: a DDP wrapper's keys start with
    `module.`, so the wrapper is not passed, and the refusal names the line. (The
    fixture is copied where the snapshot's relative paths land under `tmp_path`.)"""
    project = tmp_path / "fixtures" / "facts" / "step_module"
    shutil.copytree(FACTS_FIXTURES / "step_module", project)
    mylib = project / "mylib.py"
    mylib.write_text(mylib.read_text().replace(
        "    optimizer.step()\n", "    optimizer.step()\n    last = model.state_dict()\n"
    ))  # fmt: skip
    data = json.loads((SNAPSHOTS / f"{STEP_MODULE}.json").read_text())
    facts = RunFacts.from_json(absolute(data, tmp_path))
    conversion, _ = converted(DDP, script=project / "train.py", facts=facts)
    [reason] = [r for r in wrong(conversion) if "train_step" in r]
    assert "cannot be given a DDP wrapper of `model`" in reason
    assert "`last = model.state_dict()`" in reason


def test_a_model_in_a_dict_is_wrapped_by_its_item():
    facts, path, source = snapshot("model_dict")
    conversion = convert_source(source, DDP, str(path), ConversionFacts(facts, path, source))
    assert wrong(conversion) == []
    text = conversion.converted
    assert 'models = {"net": Net()}\n# trained through DDP when distributed' in text
    assert (
        'ddp_net = models["net"]\nif DISTRIBUTED:\n    ddp_net = DDP(\n        models["net"],'
        in text
    )
    assert "loss = nn.functional.mse_loss(ddp_net(x), y)" in text
    assert 'optimizer = torch.optim.SGD(models["net"].parameters(), lr=0.05)' in text


def test_a_model_in_a_dict_is_still_refused_by_fsdp():
    facts, path, source = snapshot("model_dict")
    conversion = convert_source(source, FSDP, str(path), ConversionFacts(facts, path, source))
    [reason] = [r for r in wrong(conversion) if "the run shows" in r]
    assert "under --to fsdp, an item of a container" in reason


@pytest.mark.parametrize(
    "key, wrapper",
    [("model", "ddp_model"), ("self.net", "self.ddp_net"), ('models["net"]', "ddp_net")],
)
def test_ddp_names(key, wrapper):
    assert ddp_name(key) == wrapper


def test_a_model_the_run_trained_but_the_code_hides_is_named_in_the_refusal(tmp_path):
    """Passed as `*(model, opt)`, the model reaches the step through names the conversion
    cannot follow, though the run saw it train: the refusal says what the run trained
    (SR-GNN's model reached `model(...)` through two functions' parameters)."""
    project = tmp_path / "fixtures" / "facts" / "step_module"
    shutil.copytree(FACTS_FIXTURES / "step_module", project)
    train = project / "train.py"
    train.write_text(
        train.read_text().replace("train_step(model, opt,", "train_step(*(model, opt),")
    )
    data = json.loads((SNAPSHOTS / f"{STEP_MODULE}.json").read_text())
    facts = RunFacts.from_json(absolute(data, tmp_path))
    conversion, _ = converted(DDP, script=train, facts=facts)
    [reason] = [r for r in wrong(conversion) if "no trained model was recognised" in r]
    assert (
        "(the run trained `nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))` made at "
        in reason
    )
    assert (
        "fixtures/facts/step_module/train.py:24:9, which reaches it through names the conversion"
        " cannot follow: function parameters or attributes)"
    ) in reason
