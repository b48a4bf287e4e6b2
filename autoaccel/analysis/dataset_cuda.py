"""Whether a Dataset uses CUDA while it makes a sample.

A DataLoader worker is a process forked from the training process, which has already
initialised CUDA; the first CUDA call in a worker fails with "Cannot re-initialize CUDA
in forked subprocess" (pytorch/pytorch#77159); and a batch already on the GPU cannot be
pinned ("cannot pin 'torch.cuda.FloatTensor'"). A Dataset whose `__getitem__` moves its
sample to the GPU, or runs a module that lives there, loads in the main process, unpinned.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from autoaccel.analysis.devices import ACCELERATORS, device_types
from autoaccel.analysis.positions import Positions
from autoaccel.analysis.program import FunctionInfo, Kind, Obj, Program, SourceModule, argument
from autoaccel.analysis.script_model import ScriptModel
from autoaccel.analysis.shapes import is_attribute

# The way out the rules that leave such a loader alone suggest.
MOVE_TO_LOOP = "move the `.to(device)` out of `__getitem__` into the training loop"


def loader_cuda_use(loader: cst.Call, script: ScriptModel) -> str | None:
    """Where a dataset the `DataLoader(...)` call `loader` may read uses CUDA while making a
    sample (`line 21`, or `sounds.py:21` in another file of the project), if one does. A
    device the analysis cannot see counts as CUDA in a script that uses CUDA."""
    program = script.program
    dataset = argument(loader, 0, "dataset")
    if program is None or dataset is None:
        return None
    for obj in script.values(dataset):
        call = cuda_in_getitem(obj, program, unknown=script.uses_cuda)
        if call is not None:
            module = program.module_of[call]
            line = Positions(module.tree)[call].start.line
            if module is script.module:
                return f"line {line}"
            return f"{Path(module.path or module.name).name}:{line}"
    return None


def cuda_in_getitem(dataset: Obj, program: Program, unknown: bool = False) -> cst.Call | None:
    """The first call that may use CUDA in `dataset`'s `__getitem__` or in a function of the
    project it calls: `.cuda()`, `.to(device)` or `device=` of an accelerator device, or a
    call of a module moved to one (`self.mel = MelSpectrogram().to(device)` in `__init__`).
    `unknown`: count a device the analysis cannot see (`.to(self.device)` of `args.device`)
    as an accelerator. None when there is none, or `dataset` is no instance of a class of
    the project."""
    getitem = dataset.cls.method("__getitem__") if dataset.cls is not None else None
    if getitem is None:
        return None
    reached: list[FunctionInfo] = [getitem]
    on_device: set[Obj] | None = None  # what the program moves to an accelerator, once needed
    for function in reached:
        for call in program.calls:
            if program.function_of.get(call) is not function:
                continue
            if _to_accelerator(call, program, unknown):
                return call
            called = program.values_of(call.func, function.module)
            if called:
                if on_device is None:
                    on_device = _moved_to_accelerator(program, unknown)
                if called & on_device:
                    return call
            reached += [f for f in program.callees.get(call, ()) if f not in reached]
    return None


def _to_accelerator(call: cst.Call, program: Program, unknown: bool) -> bool:
    """`x.cuda()`, `x.to(device)` or `f(..., device=device)` with an accelerator device."""
    if is_attribute(call.func, "cuda"):
        return True
    target = argument(call, 0, "device") if is_attribute(call.func, "to") else None
    if target is None:
        target = next(
            (a.value for a in call.args if a.keyword and a.keyword.value == "device"), None
        )
    return target is not None and _may_be_accelerator(
        target, program.module_of[call], program, unknown
    )


def _may_be_accelerator(
    device: cst.BaseExpression, module: SourceModule, program: Program, unknown: bool
) -> bool:
    """Whether `device` may name an accelerator: the code says so, or names a device without
    saying its type (`torch.device(args.device)`), or (`unknown`) says nothing the analysis
    can see (a `torch.float16` is a dtype, a CPU device is none)."""
    known = False
    for obj in program.values_of(device, module):
        types = device_types(obj, program)
        if types & ACCELERATORS or (obj.kind is Kind.DEVICE and not types):
            return True
        known = known or bool(types)
    return unknown and not known and not module.index.qualified_names(device)


def _moved_to_accelerator(program: Program, unknown: bool) -> set[Obj]:
    """What the program moves to an accelerator: modules (`module.to(device)`, `.cuda()`)."""
    moved: set[Obj] = set()
    for call in program.calls:
        if is_attribute(call.func, "to", "cuda") and _to_accelerator(call, program, unknown):
            receiver = call.func.value  # type: ignore[attr-defined]
            moved |= program.values_of(receiver, program.module_of[call])
    return moved
