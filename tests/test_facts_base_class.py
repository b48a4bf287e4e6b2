"""`convert --to ddp|fsdp` of projects whose model the static analysis cannot see, with
facts from a short run (`autoaccel.facts`), in whichever module of the project trains it:

* fixtures/facts/base_class/: `self.model` is set by a base class of another module
  (`self.model = self._build_model().to(self.device)`), and `train()` of the subclass
  builds the optimizer and loops, its forward in `self._step(x)`;
* fixtures/facts/model_by_import/: run.py builds `import_module("models." + name).Model(...)`
  and hands it to `train(config, model, loader)` of train_eval.py, which loops.

The facts are the recorder's snapshots (tests/snapshots/facts/base_class/main.json,
model_by_import/run.json); the test that they are current, and the two-rank runs of the
results, are in tests/test_facts_convert_runs.py and tests/test_facts_base_class_runs.py.
"""

from __future__ import annotations

import pytest
from test_facts import DDP, FACTS_FIXTURES, FSDP, snapshot, wrong

from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.facts.resolve import ConversionFacts
from autoaccel.fileio import read_source

BASE_CLASS = "base_class/main"
MODEL_BY_IMPORT = "model_by_import/run"


def converted(name: str, options, with_facts: bool = True) -> dict:
    """The project conversion of the fixture `name` (with its facts unless `with_facts`
    is False): each file's conversion by file name."""
    script = FACTS_FIXTURES / f"{name}.py"
    project = find_project(script, read_source(script))
    assert project is not None
    given = None
    if with_facts:
        given = ConversionFacts(snapshot(name)[0], script, project.script.source.text)
    result = convert_project(project, options, str(script), given)
    return {f.file.path.name: f.conversion for f in result.files}


def refusals(conversions: dict) -> list[str]:
    return [reason for conversion in conversions.values() for reason in wrong(conversion)]


@pytest.mark.parametrize("name", [BASE_CLASS, MODEL_BY_IMPORT])
@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_refused_without_facts(name, options):
    assert any(
        "no trained model was recognised" in r for r in refusals(converted(name, options, False))
    )


def test_facts_wrap_a_model_of_the_base_class_before_the_loop():
    conversions = converted(BASE_CLASS, DDP)
    assert refusals(conversions) == []
    text = conversions["exp.py"].converted
    # ready when `train()` starts (the base class built and moved it): wrapped before the loop
    assert (
        "        criterion = nn.MSELoss()\n"
        "        # trained through DDP when distributed: gradients are averaged in backward()\n"
        "        self.ddp_model = self.model\n"
        "        if DISTRIBUTED:\n"
        "            self.ddp_model = DDP(\n"
        "                self.model,\n"
    ) in text
    assert "    def _step(self, x):\n        return self.ddp_model(x)\n" in text


def test_facts_shard_a_model_of_the_base_class_before_its_optimizer():
    conversions = converted(BASE_CLASS, FSDP)
    assert refusals(conversions) == []
    text = conversions["exp.py"].converted
    assert (
        "        if DISTRIBUTED:\n"
        "            shard_model(self.model)\n"
        "        opt = torch.optim.Adam(self.model.parameters(), lr=0.01)\n"
    ) in text
    assert "return self.model(x)" in text


def test_facts_wrap_a_model_built_by_name_where_another_module_trains_it():
    conversions = converted(MODEL_BY_IMPORT, DDP)
    assert refusals(conversions) == []  # run.py builds it, train_eval.py trains it
    text = conversions["train_eval.py"].converted
    assert (
        "    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate)\n"
        "    # trained through DDP when distributed: gradients are averaged in backward()\n"
        "    ddp_model = model\n"
    ) in text
    assert "            outputs = ddp_model(x)\n" in text
    assert "    train(config, model, loader)\n" in conversions["run.py"].converted


def test_facts_shard_a_model_built_by_name_before_the_optimizer_of_the_loop():
    """The optimizer of `train(config, model, loader)` is built from the model it
    receives, in the statement just before the loop: the sharding goes before it."""
    conversions = converted(MODEL_BY_IMPORT, FSDP)
    assert refusals(conversions) == []
    assert (
        "    model.train()\n"
        "    # sharded with FSDP2 when distributed: each process keeps a share of the\n"
        "    # parameters, gradients and optimizer state\n"
        "    if DISTRIBUTED:\n"
        "        shard_model(model)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate)\n"
    ) in conversions["train_eval.py"].converted
