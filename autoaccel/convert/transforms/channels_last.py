"""`--channels-last`: NHWC memory format for a convolutional model and its image batches."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.names import name_key
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.transform import Transform
from autoaccel.cst_edit import keyword_value, set_keyword

MEMORY_FORMAT = "torch.channels_last"


class ChannelsLast(Transform):
    DESCRIPTION = "Use torch.channels_last for the model and its image batches."
    code = "channels-last"

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        return options.channels_last

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        result = super().transform_module_impl(tree)
        if not self.script.has_convolutions:
            self.skipped("channels_last", "the script has no convolutions: nothing to gain")
        return result

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.script.has_convolutions:
            return updated_node
        func = updated_node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "to"):
            return updated_node
        if keyword_value(updated_node, "memory_format") is not None:
            return updated_node
        key = name_key(func.value) or name_key(_call_root(func.value))
        if key in self.script.models:
            self.changed(original_node, f"`{key}` uses channels_last")
            return set_keyword(updated_node, "memory_format", MEMORY_FORMAT)
        if self._is_image_batch(original_node, key):
            self.changed(original_node, f"image batch `{key}` uses channels_last")
            return set_keyword(updated_node, "memory_format", MEMORY_FORMAT)
        return updated_node

    def _is_image_batch(self, node: cst.Call, key: str | None) -> bool:
        """The first name a step loop binds (`for images, labels in loader`)."""
        for loop in self.script.step_loops.values():
            names = _first_target_name(loop.node)
            if names is not None and names == key and _inside(self, node, loop.node):
                return True
        return False


def _call_root(expression: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(expression, cst.Call):
        expression = (
            expression.func.value if isinstance(expression.func, cst.Attribute) else expression.func
        )
    return expression


def _first_target_name(loop: cst.CSTNode) -> str | None:
    """`images` in `for images, labels in loader` / `for i, (images, labels) in enumerate(...)`."""
    if not isinstance(loop, cst.For):
        return None
    target = loop.target
    enumerated = m.matches(loop.iter, m.Call(func=m.Name("enumerate")))
    if enumerated and isinstance(target, cst.Tuple) and len(target.elements) == 2:
        target = target.elements[1].value
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
        target = target.elements[0].value
    return target.value if isinstance(target, cst.Name) else None


def _inside(transform: Transform, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:

    parent = transform.parent(node)
    while parent is not None:
        if parent is ancestor:
            return True
        parent = transform.parent(parent)
    return False
