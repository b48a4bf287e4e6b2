"""Two shapes of the seventh unseen set under `--to fsdp`, each refused where it was
converted wrongly:

- ncf: `Engine.train_an_epoch()` (fixtures/fsdp/engine_init/engine.py) trains the
  `self.model` that a subclass's `__init__` in another module builds before the base
  class builds the optimizer from it. It was sharded in `train_an_epoch()`, once per
  epoch (the second epoch crashed: "c10d.broadcast_ has no sharding strategy"), after
  the optimizer took the unsharded parameters.
- ltsf (F4): an early stopping of another module (fixtures/fsdp/reload_best/stopping.py),
  given the sharded model, saves `model.state_dict()` among other work. That module is
  left as it is under fsdp, so each process saved its own shards (DTensors), and the
  reload after training crashed in `load_full_state_dict`."""

from __future__ import annotations

from pathlib import Path

from autoaccel.convert.log import ConvertOptions, Skipped
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.fileio import read_source
from running import FIXTURES_DIR

FIXTURES = FIXTURES_DIR / "fsdp"


def refusals(script: Path) -> list[tuple[str, Skipped]]:
    """The refusals of converting `script` to fsdp, each with its file's name."""
    project = find_project(script, read_source(script))
    assert project is not None
    result = convert_project(project, ConvertOptions(target="fsdp", amp="off"), str(script))
    return [
        (f.file.path.name, s) for f in result.files for s in f.conversion.log.skipped if s.wrong
    ]


def test_a_model_that_another_module_builds_in_init_is_not_sharded_each_epoch():
    ((name, refused),) = refusals(FIXTURES / "engine_init" / "train.py")
    assert (name, refused.what, refused.line) == ("engine.py", "fully_shard", 20)
    assert refused.reason.startswith(
        "`train_an_epoch()` trains `self.model`, built by `self.model = Factorisation(20, 30,"
        " 8)` in `FactorisationEngine.__init__()` (train.py), and is called in a loop of"
        " train.py"
    )


def test_a_save_of_the_sharded_model_in_a_module_left_as_it_is_is_refused():
    ((name, refused),) = refusals(FIXTURES / "reload_best" / "train.py")
    assert (name, refused.what, refused.line) == ("train.py", "full state dict", 30)
    assert refused.reason.startswith(
        "`EarlyStopping.__call__()` (stopping.py:11) saves a checkpoint given the sharded"
        " `model`: each process would save its own part of it; gather it with"
        " `full_state_dict(model)`"
    )
