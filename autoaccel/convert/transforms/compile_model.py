"""`--compile`: compile the trained model in place with `nn.Module.compile()`.

In-place compilation keeps `model.state_dict()` keys free of the `_orig_mod.`
prefix that `model = torch.compile(model)` would add, so checkpoints stay loadable.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import method_calls
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.transform import Transform


class CompileModel(Transform):
    DESCRIPTION = "Compile the trained model with torch.compile (in place)."
    code = "compile"

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        return options.compile

    def visit_Module(self, node: cst.Module) -> None:
        self.compiled = {
            name_key(call.func.value)  # type: ignore[attr-defined]
            for call in method_calls(node, "compile")
        }
        self.trained = self.script.trained
        self.done: set[str] = set()
        if not self.trained:
            self.skipped(
                "torch.compile",
                "no optimizer is given a model's `.parameters()`, so the trained model is"
                " not known; call `model.compile()` on it by hand",
            )

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        assign = updated_node.body[0] if len(updated_node.body) == 1 else None
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return updated_node
        key = name_key(assign.targets[0].target)
        if key is None or key not in self.trained or key in self.compiled | self.done:
            return updated_node
        if not isinstance(assign.value, cst.Call):
            return updated_node
        self.done.add(key)
        self.changed(original_node, f"compile `{key}` with `{key}.compile()`")
        return cst.FlattenSentinel([updated_node, cst.parse_statement(f"{key}.compile()\n")])
