"""A trained model called through its `forward` method is called as the module itself.

`net.forward(a, b)` skips what `nn.Module.__call__` runs around the forward: the hooks
that `fully_shard` registers (the parameters gathered before the forward, the gradients
reduced after the backward), and what the conversions' wrappers rely on when they take the
model's name. `net(a, b)` runs the same forward with them; in a script that registers no
hooks of its own the result is the same.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.training import trains
from autoaccel.convert.log import MULTI_PROCESS, ConvertOptions
from autoaccel.convert.transform import Transform
from autoaccel.cst_edit import code_of


class CallModules(Transform):
    DESCRIPTION = "Call a trained model as a module, not through its `forward` method."
    code = "forward-call"

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        return options.target in (*MULTI_PROCESS, "dp")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = original_node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "forward"):
            return updated_node
        model = func.value
        if isinstance(model, cst.Call) or code_of(model) == "self":  # `super().forward(x)`
            return updated_node
        if not any(trains(self.script.training, o) for o in self.script.values(model)):
            return updated_node
        self.changed(
            original_node,
            f"`{code_of(model)}.forward(...)` called as `{code_of(model)}(...)`: the module's"
            " own call runs the hooks that DDP, FSDP and DataParallel work through",
        )
        return updated_node.with_changes(func=updated_node.func.value)  # type: ignore[attr-defined]
