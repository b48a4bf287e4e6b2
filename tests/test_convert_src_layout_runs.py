"""tests/test_convert_src_layout.py's fixture converted `--to ddp` with its default proof
(two processes, gloo): it passes, and the copy keeps the package's folder, so that it runs
from where it is written."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR, convert_in_copy

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def test_a_src_layout_package_converts_and_passes_its_proof(tmp_path):
    script, out = "src/tinyvit/cli/main.py", tmp_path / "out"
    proc = convert_in_copy(
        tmp_path, FIXTURES_DIR / "facts" / "src_layout", script, "--to", "ddp", "-o", out
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--verify ok   parameters equal on every process" in proc.stderr
    assert (tmp_path / "out" / "tinyvit" / "training" / "loop.py").is_file()
