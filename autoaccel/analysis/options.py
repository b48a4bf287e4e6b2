"""The defaults of a script's command-line options: `opt.batch_size` where
`opt = parser.parse_args()` and `parser.add_argument("--batch_size", type=int, default=64)`.

What a layer's width or a loader's batch size is when the script runs as written. Parsers
are `argparse.ArgumentParser` objects (by qualified name, through the program model);
an option's attribute is its `dest=`, or its first long flag with `-` read as `_`. An
option defined twice, or with a default that is not written out, has none.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.program import Program, SourceModule

PARSER = "argparse.ArgumentParser"


class OptionDefaults:
    """The defaults of the options of the program's parsers, by module (found once)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self._defaults: dict[int, dict[str, cst.BaseExpression | None]] = {}

    def default(self, node: cst.BaseExpression, module: SourceModule) -> cst.BaseExpression | None:
        """The default of the option `node` reads (`args.hidden`), an expression of
        `module`; None when `node` is no option or its default is not written out."""
        if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
            return None
        if not self._parsed_options(node.value, module):
            return None
        return self._of(module).get(node.attr.value)

    def _parsed_options(self, name: cst.Name, module: SourceModule) -> bool:
        """Whether `name` is bound, once at the top level, to `parser.parse_args()`."""
        bound = [
            statement.body[0]
            for statement in module.tree.body
            if isinstance(statement, cst.SimpleStatementLine)
            and isinstance(statement.body[0], cst.Assign)
            and any(
                isinstance(t.target, cst.Name) and t.target.value == name.value
                for t in statement.body[0].targets  # type: ignore[union-attr]
            )
        ]
        if len(bound) != 1:
            return False
        value = bound[0].value  # type: ignore[union-attr]
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "parse_args"
            and self._is_parser(value.func.value, module)
        )

    def _is_parser(self, node: cst.BaseExpression, module: SourceModule) -> bool:
        return any(
            isinstance(obj.node, cst.Call)
            and PARSER in obj.module.index.qualified_names(obj.node.func)
            for obj in self.program.values_of(node, module)
        )

    def _of(self, module: SourceModule) -> dict[str, cst.BaseExpression | None]:
        found = self._defaults.get(id(module))
        if found is None:
            found = self._defaults[id(module)] = {}
            for call in self.program.calls:
                func = call.func
                if (
                    self.program.module_of.get(call) is not module
                    or not isinstance(func, cst.Attribute)
                    or func.attr.value != "add_argument"
                    or not self._is_parser(func.value, module)
                ):
                    continue
                dest = _dest(call)
                if dest is not None:
                    # defined twice: which one runs is not known
                    found[dest] = _keyword(call, "default") if dest not in found else None
        return found


def _dest(call: cst.Call) -> str | None:
    written = _keyword(call, "dest")
    if isinstance(written, cst.SimpleString):
        text = written.evaluated_value
        return text if isinstance(text, str) else None
    flags = [
        a.value.evaluated_value
        for a in call.args
        if a.keyword is None and isinstance(a.value, cst.SimpleString)
    ]
    long = next((f for f in flags if isinstance(f, str) and f.startswith("--")), None)
    short = next((f for f in flags if isinstance(f, str) and not f.startswith("-")), None)
    flag = long[2:] if long else short
    return flag.replace("-", "_") if flag else None


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next(
        (a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None
    )
