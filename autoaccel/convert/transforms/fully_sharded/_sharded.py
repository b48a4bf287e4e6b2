"""Which models of a module `--to fsdp` shards, and which calls run one of them."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import ScriptModel
from autoaccel.analysis.shapes import find, is_name, name_calls
from autoaccel.convert.transforms.fully_sharded._helpers import COLLECTIVES, SHARD

# Methods of a sharded model that run no forward pass and gather nothing.
_LOCAL_METHODS = frozenset(
    {"train", "eval", "parameters", "named_parameters", "modules", "children", "zero_grad", "to"}
)


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


def script_functions(module: cst.Module) -> set[str]:
    """Names of the functions and methods the module defines."""
    return {function.name.value for function in find(module, cst.FunctionDef)}


def runs_sharded_model(call: cst.Call, sharded: set[str], functions: set[str]) -> bool:
    """Whether `call` needs every process: a forward pass of a sharded model (`model(x)`,
    `model.generate(x)`), a function of the script given one (`evaluate(model, loader)`), or
    a helper that gathers its state."""
    func = call.func
    if name_key(func) in sharded or is_name(func, *COLLECTIVES):
        return True
    if isinstance(func, cst.Attribute) and name_key(func.value) in sharded:
        return func.attr.value not in _LOCAL_METHODS
    callee = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
    return callee in functions and any(name_key(arg.value) in sharded for arg in call.args)
