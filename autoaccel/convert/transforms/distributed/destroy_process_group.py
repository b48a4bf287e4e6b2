"""`dist.destroy_process_group()` when the script ends: at the end of the module, or of
its `if __name__ == "__main__":` block."""

from __future__ import annotations

import textwrap

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.shapes import method_calls
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    parse_statements,
)

_MAIN = m.If(test=m.Comparison(left=m.Name("__name__")))


class DestroyProcessGroup(DistributedStep):
    DESCRIPTION = "Destroy the process group at the end of the script."
    entry_only = True
    ending = "dist.destroy_process_group()\n"  # the block's body, without its indentation
    imports_needed: tuple[str, ...] = ()

    def visit_Module(self, node: cst.Module) -> None:
        if method_calls(node, "destroy_process_group"):
            return
        last = node.body[-1]
        if m.matches(last, _MAIN) and isinstance(last.body, cst.IndentedBlock):  # type: ignore[attr-defined]
            last = last.body.body[-1]  # type: ignore[attr-defined]
        self.after.setdefault(last, []).extend(
            parse_statements(f"\nif {DISTRIBUTED}:\n{textwrap.indent(self.ending, '    ')}")
        )
        self.imports.extend(self.imports_needed)
        self.changed(last, "process group destroyed at the end")
