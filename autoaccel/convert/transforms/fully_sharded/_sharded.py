"""Which models of a module `--to fsdp` shards."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import ScriptModel
from autoaccel.analysis.shapes import name_calls
from autoaccel.convert.transforms.fully_sharded._helpers import SHARD


def sharded_models(module: cst.Module, script: ScriptModel) -> set[str]:
    """The names of `module` that hold a model `shard_model(...)` shards (`model`,
    `self.net`): given to it here, or holding a trained model, which `ShardModel`
    shards wherever its optimizer is built (the callback of chargpt.py saves the model
    `mingpt/trainer.py` shards)."""
    return given_to_shard(module) | script.names_of(script.training.trained)


def given_to_shard(module: cst.Module) -> set[str]:
    """The names `shard_model(...)` is called with in `module`."""
    given = {name_key(call.args[0].value) for call in name_calls(module, SHARD) if call.args}
    return given - {None}  # type: ignore[return-value]
