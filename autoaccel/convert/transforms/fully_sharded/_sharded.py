"""Which models of a module `--to fsdp` shards."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import ScriptModel
from autoaccel.analysis.shapes import name_calls
from autoaccel.convert.transforms.fully_sharded._helpers import SHARD, STATE_CODE


def sharded_models(module: cst.Module, script: ScriptModel) -> set[str]:
    """The names of `module` that hold a model `shard_model(...)` shards (`model`,
    `self.net`): given to it here, or holding a trained model, which `ShardModel`
    shards wherever its optimizer is built (the callback of chargpt.py saves the model
    `mingpt/trainer.py` shards)."""
    trained = script.holders(script.training.trained)
    return given_to_shard(module) | {key for code, key in trained if not _inserted_helper(code)}


def given_to_shard(module: cst.Module) -> set[str]:
    """The names `shard_model(...)` is called with in `module`."""
    given = {name_key(call.args[0].value) for call in name_calls(module, SHARD) if call.args}
    return given - {None}  # type: ignore[return-value]


def _inserted_helper(code: cst.CSTNode) -> bool:
    """Whether `code` is a function the conversion defines (`shard_model(model)`): its
    parameter holds the model, under a name the script's own code does not use."""
    return isinstance(code, cst.FunctionDef) and code.name.value in {SHARD, *STATE_CODE}
