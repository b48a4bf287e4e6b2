"""tests/test_convert_cached_dataset.py's fixture converted `--to fsdp` with its default
proof (two processes, gloo): it passes, the cache written by one process."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR, convert_in_copy

pytest.importorskip("torch")
pytestmark = pytest.mark.runs


def test_fsdp_conversion_of_a_caching_dataset_passes_its_proof(tmp_path):
    project = FIXTURES_DIR / "facts" / "cached_dataset"
    proc = convert_in_copy(tmp_path, project, "main.py", "--to", "fsdp", "-o", tmp_path / "out")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "--verify ok   one process writes each file: 1 file(s) written" in output
    assert (tmp_path / "out" / "points.py").read_text().count("if RANK == 0:") == 2
