"""Drop `nn.DataParallel`: each process now trains its own replica under DDP.

`model = nn.DataParallel(model)` goes, and with it an `if torch.cuda.device_count() > 1:`
around it that only prints; `model.module` becomes `model` (outside an
`isinstance(model, nn.DataParallel)` test, which is simply never true any more), also in
another module of the project given the wrapper (`self.model.module` of a solver class).
A checkpoint the unwrapped model loads has its `module.` prefix stripped first
(`checkpoint_keys`). A functional `nn.parallel.data_parallel(...)` in a model's `forward` is reported: it
would split each process's batch over GPUs that other processes use.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import Kind, Obj
from autoaccel.analysis.script_model import DATA_PARALLEL, strip_device_moves
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.checkpoint_keys import loads_into, strip_prefix
from autoaccel.convert.transforms.distributed._base import DistributedStep

DATA_PARALLEL_FUNCTION = "torch.nn.parallel.data_parallel"
_PRINT_LINE = m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=m.Name("print")))])


class ReplaceDataParallel(DistributedStep):
    DESCRIPTION = "Remove nn.DataParallel; DistributedDataParallel replaces it."
    needs = ("DataParallel", "data_parallel", ".module")
    code = "ACC401"

    def visit_Module(self, node: cst.Module) -> None:
        self.unwrapped: set[str] = set()
        self.loads: set[cst.Call] = set()

    def visit_Call(self, node: cst.Call) -> None:
        if loads_into(node, self.unwrapped):
            self.loads.add(node)
            self.before.setdefault(self.statement_of(node), []).extend(strip_prefix(node)[0])
            self.changed(
                node,
                "checkpoints saved under nn.DataParallel still load: `module.` prefix stripped",
            )
        if DATA_PARALLEL_FUNCTION in self.qualified_names(node.func):
            self.skipped(
                "nn.parallel.data_parallel",
                "this splits each process's batch over several GPUs, which the other"
                " processes use too; under DDP call the module directly (one GPU per"
                " process), by hand",
                node,
            )

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        wrap = strip_device_moves(value)  # `nn.DataParallel(model).cuda()` too
        if not (
            isinstance(wrap, cst.Call)
            and DATA_PARALLEL in self.qualified_names(wrap.func)
            and len(node.targets) == 1
            and wrap.args
        ):
            return
        target = name_key(node.targets[0].target)
        inner = wrap.args[0].value
        line = self.parent(node)
        if not _removable(node, line):
            self.skipped("nn.DataParallel", "remove this DataParallel wrapper by hand", node)
            return
        assert target is not None and isinstance(line, cst.SimpleStatementLine)
        self.unwrapped.add(target)
        if name_key(inner) == target and wrap is value:
            removed = self._removable_if(line) or line
            self.replace[removed] = []
        else:  # `model = model.cuda()`: the move stays
            unwrapped = inner if wrap is value else value.deep_replace(wrap, inner)
            self.replace[line] = [line.with_changes(body=[node.with_changes(value=unwrapped)])]
        self.changed(
            node, "`nn.DataParallel` removed: each process trains its own replica under DDP"
        )

    def _removable_if(self, line: cst.SimpleStatementLine) -> cst.If | None:
        """The `if` around `line` when it holds nothing else but prints."""
        block = self.parent(line)
        owner = self.parent(block) if block is not None else None
        if not isinstance(owner, cst.If) or owner.orelse is not None:
            return None
        others = [s for s in owner.body.body if s is not line]
        return owner if all(m.matches(s, _PRINT_LINE) for s in others) else None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        return strip_prefix(updated_node)[1] if original_node in self.loads else updated_node

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if original_node.attr.value != "module":
            return updated_node
        key = name_key(original_node.value)
        if (
            key not in self.unwrapped
            and not self._removed_wrappers_only(original_node.value)
            or self._under_data_parallel_test(original_node)
        ):
            return updated_node
        self.changed(original_node, f"`{key}.module` -> `{key}`: the model is no longer wrapped")
        return updated_node.value

    def _removed_wrappers_only(self, value: cst.BaseExpression) -> bool:
        """Whether `value` holds only `nn.DataParallel` wrappers that this conversion
        removes, in this module or another (the script's, given to a solver class), or
        models such a removal left without a `module` (the script converted first)."""
        program, module = self.script.program, self.script.module
        if program is None or module is None:
            return False
        held = program.flat_values_of(value, module)
        unwrapped = [obj for obj in held if obj.kind is Kind.MODULE and obj.parallel is None]
        if unwrapped and program.flat_values_of(cst.Attribute(value, cst.Name("module")), module):
            return False  # a model of the project's with a `module` of its own
        return bool(held) and all(obj in unwrapped or _removed_wrapper(obj) for obj in held)

    def _under_data_parallel_test(self, node: cst.CSTNode) -> bool:
        return any(
            isinstance(a, cst.If)
            and any(
                DATA_PARALLEL in self.qualified_names(n)
                for n in find(a.test, (cst.Attribute, cst.Name))
            )
            for a in self.ancestors(node)
        )


def _removable(assign: cst.Assign, line: cst.CSTNode | None) -> bool:
    """Whether `assign` (`model = nn.DataParallel(model)`) is a statement of its own, to
    a name or attribute: a wrapper this step removes."""
    return (
        name_key(assign.targets[0].target) is not None
        and isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
    )


def _removed_wrapper(obj: Obj) -> bool:
    """Whether `obj` is an `nn.DataParallel` wrapper made where this step removes it."""
    index = obj.module.index
    assign = index.parent(obj.node)
    return (
        obj.parallel == "dp"
        and isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and strip_device_moves(assign.value) is obj.node
        and _removable(assign, index.parent(assign))
    )
