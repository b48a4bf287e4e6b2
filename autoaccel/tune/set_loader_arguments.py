"""`autoaccel tune --write`: put the tuned values into the DataLoader calls they were
measured for, with the checks `autoaccel convert` makes before writing anything."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext

from autoaccel.analysis.script_model import Missing, Unknown
from autoaccel.convert.log import ConversionLog, ConvertOptions
from autoaccel.convert.pipeline import Conversion, check_result
from autoaccel.convert.transform import Transform, new_context
from autoaccel.cst_edit import code_of, remove_keyword, set_keyword
from autoaccel.formatting import format_inserted_code
from autoaccel.source import parse

# Keyword -> source text of its new value; None removes the keyword.
Keywords = dict[str, str | None]
# A DataLoader call: (line, column) as Python reports it, or its index among the module's
# DataLoader calls (what a position resolves to; it survives the rewrite's new lines).
Site = tuple[int, int | None] | int
Wanted = dict[Site, Keywords]

# A value that names a setting of the script (`args.workers`, `cfg["workers"]`, `workers`)
# stays: the script is configured there. Literals and calls are replaced.
_CONFIGURED = (
    m.Attribute()
    | m.Subscript()
    | m.Name(value=m.MatchIfTrue(lambda name: name not in ("True", "False", "None")))
)


class SetLoaderArguments(Transform):
    """Set the `wanted` keywords; `resolved` gets them by DataLoader call index."""

    DESCRIPTION = "Write tuned DataLoader arguments into their calls."
    code = "tune"

    def __init__(self, context: CodemodContext, wanted: Wanted) -> None:
        super().__init__(context)
        self.wanted = wanted
        self.resolved: dict[int, Keywords] = {}

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.call_edits: dict[cst.Call, Keywords] = {}
        self.value_edits: dict[cst.CSTNode, cst.BaseExpression] = {}
        return super().transform_module_impl(tree)

    def visit_Module(self, node: cst.Module) -> None:
        for site, keywords in self.wanted.items():
            index = site if isinstance(site, int) else self._index_at(*site)
            if index is None:
                self.skipped(f"DataLoader at line {site[0]}", "no `DataLoader(...)` call starts there")  # type: ignore[index]
                continue
            self.resolved[index] = keywords
            self._plan(self.script.loader_calls[index], keywords)

    def _index_at(self, line: int, column: int | None) -> int | None:
        calls = self.script.loader_calls
        on_line = [i for i, call in enumerate(calls) if self.line_of(call) == line]
        if len(on_line) > 1:
            on_line = [i for i in on_line if self._column_of(calls[i]) == column]
        return on_line[0] if len(on_line) == 1 else None

    def _column_of(self, node: cst.CSTNode) -> int:
        return self.position_of(node).start.column

    def _plan(self, call: cst.Call, keywords: Keywords) -> None:
        in_call: Keywords = {}
        for name, value in keywords.items():
            shown = f"`{name}={value}`" if value is not None else f"no `{name}`"
            current = self.script.keyword(call, name)
            if isinstance(current, Unknown):
                self.skipped(name, f"its value cannot be followed; set {shown} by hand", call)
            elif isinstance(current, Missing):
                if value is not None:
                    in_call[name] = value
                    self.changed(call, f"tuned: {shown}")
            elif m.matches(current, _CONFIGURED):
                self.skipped(name, f"set from `{code_of(current)}`; pass {shown} there", call)
            elif any(arg.value is current for arg in call.args):
                in_call[name] = value
                self.changed(call, f"tuned: {shown}")
            elif value is None:
                self.skipped(name, f"remove `{name}` from the dict passed with `**`", call)
            else:
                self.value_edits[current] = cst.parse_expression(value)
                self.changed(call, f"tuned: {shown} (in the dict passed with `**`)")
        if in_call:
            self.call_edits[call] = in_call

    def on_leave(
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel:
        updated = super().on_leave(original_node, updated_node)
        if original_node in self.value_edits:
            return self.value_edits[original_node]
        keywords = self.call_edits.get(original_node)  # type: ignore[arg-type]
        if keywords is None or not isinstance(updated, cst.Call):
            return updated
        for name, value in keywords.items():
            updated = (
                set_keyword(updated, name, value)
                if value is not None
                else remove_keyword(updated, name)
            )
        return updated


def _apply(source: str, wanted: Wanted, log: ConversionLog) -> tuple[str, dict[int, Keywords]]:
    """The rewritten source, and `wanted` with its positions resolved to call indices."""
    step = SetLoaderArguments(new_context(ConvertOptions(), log), wanted)
    tree = step.transform_module(parse(source))
    return format_inserted_code(source, tree.code), step.resolved


def set_loader_arguments(source: str, wanted: Wanted, path: str = "<string>") -> Conversion:
    """`source` with `wanted` written into its DataLoader calls. Raises `SourceError` when
    it does not parse and `ConversionError` when the result fails a safety check."""
    log = ConversionLog()
    converted, resolved = _apply(source, wanted, log)
    if converted != source:
        check_result(converted, path, lambda text: _apply(text, dict(resolved), ConversionLog())[0])
    return Conversion(source, converted, log)
