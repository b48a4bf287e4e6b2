"""Imports added by fixes go where isort would put them, and nothing else moves."""

from __future__ import annotations

import libcst as cst
import pytest

from autoaccel.cst_edit import add_imports, first_line_of, leading_import_block


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # A stdlib import joins the stdlib section; the blank line before torch stays there.
        ("import argparse\n\nimport torch\n", "import argparse\nimport os\n\nimport torch\n"),
        # No stdlib section yet: a new one on top, comments above the block stay on top.
        ("# header\nimport torch\n", "# header\nimport os\n\nimport torch\n"),
        ('"""Doc."""\nimport torch\nx = 1\n', '"""Doc."""\nimport os\n\nimport torch\nx = 1\n'),
        # In isort's order within the section; the lines already there keep their layout.
        ("import sys\nimport torch\n", "import os\nimport sys\nimport torch\n"),
        ("import argparse\nimport sys\n", "import argparse\nimport os\nimport sys\n"),
        # A new section after `from __future__` imports, as isort writes it.
        (
            "from __future__ import annotations\n\nx = 1\n",
            "from __future__ import annotations\n\nimport os\n\nx = 1\n",
        ),
        (
            "from __future__ import annotations\nimport torch\n",
            "from __future__ import annotations\n\nimport os\n\nimport torch\n",
        ),
        # Already imported: unchanged (`import os.path` binds `os` too).
        ("import os\nimport torch\n", "import os\nimport torch\n"),
        ("import os.path\n", "import os.path\n"),
    ],
)
def test_stdlib_import_goes_to_the_stdlib_section(source, expected):
    assert add_imports(cst.parse_module(source), ("os",)).code == expected


def test_third_party_import_goes_after_the_import_block():
    source = "import os\n\nimport numpy as np\n\nx = 1\n"
    assert add_imports(cst.parse_module(source), ("torch",)).code == (
        "import os\n\nimport numpy as np\nimport torch\n\nx = 1\n"
    )


def test_module_dunders_come_before_the_import_block():
    # PEP 8 puts `__author__ = ...` between the docstring and the imports: a fix adds
    # its imports to the block after them, as it would without them.
    source = '"""Doc."""\n__author__ = "me"\n\nimport torch\nx = 1\n'
    assert leading_import_block(cst.parse_module(source)) == (2, 3)
    assert add_imports(cst.parse_module(source), ("os",)).code == (
        '"""Doc."""\n__author__ = "me"\n\nimport os\n\nimport torch\nx = 1\n'
    )


def test_first_line_of_a_loop_is_its_header_alone():
    """PPO-for-Beginners (ninth unseen set F11): a message quoted the loop with the comment
    and blank lines above it."""
    module = cst.parse_module(
        "# This is the loop where we update\nfor _ in range(n):   # step 6\n\n\n    update()\n"
    )
    (loop,) = module.body
    assert first_line_of(loop) == "for _ in range(n):   # step 6"
    assert first_line_of(cst.parse_expression("agent.update(\n    states)")) == "agent.update("
