"""Every private piece of LibCST autoaccel leans on, in one place.

LibCST's public API has no way to generate one statement's code into a running state,
to skip its matcher-decorator set-up for a transformer that has none, or to define a
node type of one's own. autoaccel needs all three for speed and for very long string
concatenations; they reach into LibCST's private names, which may change in any
release. So they are named only here, and `pyproject.toml` pins LibCST to the range CI
tests at both ends (`.ci/run`: the lowest release of the range runs the tests that
reach these names; the newest is the one the dev install gets). Outside this module,
`tests/test_libcst_internals.py` allows a private LibCST name only where a class
implements LibCST's own protocol (a node type, the codemod's metadata hook).
"""

from __future__ import annotations

from functools import cache

import libcst as cst
from libcst._nodes.internal import CodegenState, visit_sequence

__all__ = [
    "CodegenState",
    "generate",
    "skip_matcher_setup",
    "uses_matcher_decorators",
    "visit_sequence",
]


def generate(node: cst.CSTNode, state: CodegenState) -> None:
    """Append `node`'s code to `state`'s tokens (what `Module.code` does for each node)."""
    node._codegen(state)


def skip_matcher_setup(transformer: cst.CSTTransformer) -> None:
    """Give a `MatcherDecoratableTransformer` whose class uses no matcher decorator the
    empty tables its `__init__` would have gathered with three `dir()` scans."""
    transformer._extra_visit_funcs = {}  # type: ignore[attr-defined]
    transformer._extra_leave_funcs = {}  # type: ignore[attr-defined]
    transformer._matchers = {}  # type: ignore[attr-defined]


@cache
def uses_matcher_decorators(kind: type) -> bool:
    """Whether a method of `kind` (or of its own bases) carries a matcher decorator."""
    # Here, not at the top: `autoaccel lint` never imports LibCST's matchers.
    from libcst.matchers._decorators import (
        CONSTRUCTED_LEAVE_MATCHER_ATTR,
        CONSTRUCTED_VISIT_MATCHER_ATTR,
        VISIT_NEGATIVE_MATCHER_ATTR,
        VISIT_POSITIVE_MATCHER_ATTR,
    )

    attributes = (
        VISIT_POSITIVE_MATCHER_ATTR,
        VISIT_NEGATIVE_MATCHER_ATTR,
        CONSTRUCTED_VISIT_MATCHER_ATTR,
        CONSTRUCTED_LEAVE_MATCHER_ATTR,
    )
    return any(
        hasattr(member, attribute)
        for cls in kind.__mro__
        if not cls.__module__.startswith("libcst")
        for member in vars(cls).values()
        if callable(member)
        for attribute in attributes
    )
