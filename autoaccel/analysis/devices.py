"""Which devices the device objects of a program stand for.

A device object (`Kind.DEVICE`) is made by `torch.device(...)`,
`torch.accelerator.current_accelerator()` or a device string (`"cuda:0"`). Its *types*
are the device types it may be: `cuda`, `cpu`, `mps`, `xpu`, or `ACCELERATOR` for
`torch.accelerator.current_accelerator()` (the machine's accelerator: CUDA on a GPU
box). `torch.device("cuda" if torch.cuda.is_available() else "cpu")` may be either, and
so may a name bound to `current_accelerator()` on one branch and `torch.device("cpu")`
on the other: code that runs on the accelerator when there is one is on the accelerator
path, whatever its CPU fallback is.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.program import TENSOR_TYPES, Kind, Obj, Program, is_device_string

ACCELERATOR = "accelerator"
ACCELERATOR_CALL = "torch.accelerator.current_accelerator"
DEVICE_CALL = "torch.device"
# The types whose host-to-device copies and syncs cost what they cost on CUDA.
ACCELERATORS = frozenset({"cuda", "xpu", ACCELERATOR})


def device_types(obj: Obj, program: Program, _seen: frozenset[Obj] = frozenset()) -> frozenset[str]:
    """The device types `obj` (a device object, or a legacy tensor type such as
    `torch.cuda.FloatTensor`) may be; empty when the code does not say (`torch.device(args.device)`, `torch.device(0)`).
    """
    node = obj.node
    if obj.kind is Kind.TENSOR_TYPE:  # `torch.cuda.FloatTensor`
        names = obj.module.index.qualified_names(node)
        return frozenset(TENSOR_TYPES[n] for n in names if n in TENSOR_TYPES)
    if obj.kind is not Kind.DEVICE or obj in _seen:
        return frozenset()
    if isinstance(node, cst.SimpleString):
        return _string_type(node)
    if not isinstance(node, cst.Call):
        return frozenset()
    names = obj.module.index.qualified_names(node.func)
    if ACCELERATOR_CALL in names:
        return frozenset({ACCELERATOR})
    if DEVICE_CALL not in names or not node.args:
        return frozenset()
    # `torch.device("cuda")`, `torch.device(name)` of a name bound to device strings
    found: set[str] = set()
    for value in program.values_of(node.args[0].value, obj.module):
        found |= device_types(value, program, _seen | {obj})
    return frozenset(found)


def _string_type(node: cst.SimpleString) -> frozenset[str]:
    if not is_device_string(node):
        return frozenset()
    return frozenset({str(node.evaluated_value).split(":")[0]})
