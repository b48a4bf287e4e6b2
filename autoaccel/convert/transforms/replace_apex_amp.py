"""apex.amp -> plain float32 statements, which `AddAutocast` then runs under `torch.amp`.

`model, optimizer = amp.initialize(model, optimizer, opt_level=...)` is removed (it hands
back the objects it was given), `with amp.scale_loss(loss, optimizer) as scaled_loss:
scaled_loss.backward()` becomes `loss.backward()`, and the `from apex import amp` /
`import apex` lines go. Any other apex.amp use (`amp.master_params`, `amp.state_dict`, ...)
or form leaves the script's apex untouched, with the line that stops it.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.analysis.shapes import find
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.transform import StatementRewrite

_APEX = "apex.amp"


def _arg_keys(call: cst.Call) -> list[str | None]:
    return [name_key(a.value) if a.keyword is None and not a.star else None for a in call.args]


class ReplaceApexAmp(StatementRewrite):
    DESCRIPTION = "Replace apex.amp by torch.amp."
    code = "ACC302"
    needs = ("apex",)  # no apex import, nothing to replace

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        return options.amp != "off"  # `--amp off`: the script keeps its precision

    def visit_Module(self, node: cst.Module) -> None:
        self.replacements: dict[cst.CSTNode, cst.BaseStatement | None] = {}
        uses = [c for c in find(node, cst.Call) if self._is_apex(c.func)]
        if not uses:
            return
        for call in uses:
            statement = self._statement_of(call)
            replacement = self._replacement(call, statement)
            if replacement is False:
                self.replacements = {}
                self.skipped(
                    "apex.amp",
                    f"`{cst.Module([]).code_for_node(call.func)}(...)` has no torch.amp"
                    " rewrite here; replace apex.amp by torch.autocast and"
                    ' torch.amp.GradScaler("cuda") by hand',
                    call,
                )
                return
            self.replacements[statement] = replacement
        imports = [
            s
            for s in find(node, cst.SimpleStatementLine)
            if len(s.body) == 1
            and isinstance(s.body[0], (cst.Import, cst.ImportFrom))
            and self._imports_only_apex(s.body[0])
        ]
        for statement in imports:
            block = self.parent(statement)
            if block is not None and not isinstance(block, cst.Module) and len(block.body) == 1:  # type: ignore[attr-defined]
                self.replacements = {}
                self.skipped(
                    "apex.amp", "apex is imported alone in a block; remove it by hand", statement
                )
                return
            self.replacements[statement] = None
        for statement, replacement in self.replacements.items():
            if statement not in imports:
                what = (
                    "removed (torch.amp needs no initialize)"
                    if replacement is None
                    else ("scaled backward becomes a plain backward; the step gets torch.autocast")
                )
                self.changed(statement, f"apex.amp: {what}")

    def _is_apex(self, func: cst.BaseExpression) -> bool:
        return any(n == _APEX or n.startswith(_APEX + ".") for n in self.qualified_names(func))

    def _imports_only_apex(self, node: cst.Import | cst.ImportFrom) -> bool:
        if isinstance(node, cst.ImportFrom):
            return m.matches(
                node, m.ImportFrom(module=m.Name("apex"), names=[m.ImportAlias(name=m.Name("amp"))])
            )
        return all(
            m.matches(
                a.name, m.Name("apex") | m.Attribute(value=m.Name("apex"), attr=m.Name("amp"))
            )
            for a in node.names
        )

    def _statement_of(self, call: cst.Call) -> cst.CSTNode:
        return next(
            a for a in self.ancestors(call) if isinstance(a, (cst.SimpleStatementLine, cst.With))
        )

    def _replacement(
        self, call: cst.Call, statement: cst.CSTNode
    ) -> cst.BaseStatement | None | bool:
        """None: remove `statement`; a statement: put it instead; False: cannot."""
        names = self.qualified_names(call.func)
        if f"{_APEX}.initialize" in names and isinstance(statement, cst.SimpleStatementLine):
            assign = statement.body[0] if len(statement.body) == 1 else None
            if (
                not isinstance(assign, cst.Assign)
                or assign.value is not call
                or len(assign.targets) != 1
            ):
                return False
            target = assign.targets[0].target
            targets = (
                [e.value for e in target.elements]
                if isinstance(target, (cst.Tuple, cst.List))
                else [target]
            )
            given = _arg_keys(call)[: len(targets)]
            # apex returns the objects it was given: the assignment changes nothing
            return None if [name_key(t) for t in targets] == given and None not in given else False
        if f"{_APEX}.scale_loss" in names and isinstance(statement, cst.With):
            item = statement.items[0]
            scaled = name_key(item.asname.name) if item.asname is not None else None  # type: ignore[arg-type]
            body = statement.body.body
            if (
                len(statement.items) != 1
                or item.item is not call
                or scaled is None
                or not call.args
                or len(body) != 1
                or not m.matches(
                    body[0],
                    m.SimpleStatementLine(
                        body=[
                            m.Expr(
                                m.Call(
                                    func=m.Attribute(value=m.Name(scaled), attr=m.Name("backward"))
                                )
                            )
                        ]
                    ),
                )
            ):
                return False
            backward = body[0].body[0].value  # type: ignore[attr-defined]
            plain = backward.with_changes(func=backward.func.with_changes(value=call.args[0].value))
            return cst.SimpleStatementLine(
                body=[cst.Expr(plain)], leading_lines=statement.leading_lines
            )
        return False

    def rebuild(self, originals: list, updated: list) -> list:
        result = []
        for original, new in zip(originals, updated):
            if original not in self.replacements:
                result.append(new)
            elif self.replacements[original] is not None:
                result.append(self.replacements[original])
        return result

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(
            body=self.rebuild(list(original_node.body), list(updated_node.body))
        )
