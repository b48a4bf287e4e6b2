"""Checkpoints saved under `nn.DataParallel` still load once a conversion removes it.

`nn.DataParallel(model).state_dict()` names every key `module.<name>`; the bare model
expects `<name>`. Where a model that lost its wrapper loads a state dict, the prefix is
stripped first (a checkpoint without it is left as it is):

    model.load_state_dict(torch.load(path))
->
    state_dict = torch.load(path)
    # a checkpoint saved under nn.DataParallel names its keys `module.*`
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state_dict, "module.")
    model.load_state_dict(state_dict)
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import is_method_call

_STRIP = """\
# a checkpoint saved under nn.DataParallel names its keys `module.*`
torch.nn.modules.utils.consume_prefix_in_state_dict_if_present({state}, "module.")
"""
STATE_DICT = "state_dict"


def loads_into(call: cst.CSTNode, models: set[str]) -> bool:
    """Whether `call` is `model.load_state_dict(state, ...)` for one of `models`."""
    return (
        is_method_call(call, "load_state_dict")
        and name_key(call.func.value) in models  # type: ignore[attr-defined]
        and bool(call.args)  # type: ignore[attr-defined]
        and call.args[0].keyword is None  # type: ignore[attr-defined]
    )


def strip_prefix(call: cst.Call) -> tuple[list[cst.BaseStatement], cst.Call]:
    """The statements that strip the prefix before `call` (a `load_state_dict`), and the
    call, which reads a state dict named first when it was built in the call."""
    state = call.args[0].value
    before: list[cst.BaseStatement] = []
    if name_key(state) is None and not isinstance(state, cst.Subscript):
        before.append(
            cst.parse_statement(f"{STATE_DICT} = {cst.Module([]).code_for_node(state)}\n")
        )
        state = cst.Name(STATE_DICT)
        call = call.with_changes(args=[call.args[0].with_changes(value=state), *call.args[1:]])
    module = cst.parse_module(_STRIP.format(state=cst.Module([]).code_for_node(state)))
    strip = module.body[0].with_changes(leading_lines=module.header)
    return [*before, strip], call
