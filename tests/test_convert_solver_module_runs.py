"""tests/test_convert_solver_module.py's fixture converted `--to ddp` with its default
proof (two processes, gloo): it passes, the solver's save written by one process."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR, convert_in_copy

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def test_ddp_conversion_of_a_solver_given_the_wrapper_passes_its_proof(tmp_path):
    project = FIXTURES_DIR / "facts" / "solver_module"
    proc = convert_in_copy(tmp_path, project, "train.py", "--to", "ddp", "-o", tmp_path / "out")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "--verify ok   one process writes each file: 1 file(s) written" in output
