"""tests/test_convert_src_layout.py's fixture converted `--to ddp` with its default proof
(two processes, gloo): it passes, and the copy keeps the package's folder, so that it runs
from where it is written."""

from __future__ import annotations

import shutil

import pytest
from running import FIXTURES_DIR, run_autoaccel

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def test_a_src_layout_package_converts_and_passes_its_proof(tmp_path):
    folder = tmp_path / "project"
    shutil.copytree(FIXTURES_DIR / "facts" / "src_layout", folder)
    script = "src/tinyvit/cli/main.py"
    proc = run_autoaccel("convert", script, "--to", "ddp", "-o", tmp_path / "out", cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--verify ok   parameters equal on every process" in proc.stderr
    assert (tmp_path / "out" / "tinyvit" / "training" / "loop.py").is_file()
