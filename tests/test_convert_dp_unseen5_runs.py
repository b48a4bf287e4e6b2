"""The short run `convert` makes for a graph tuple (tests/test_convert_dp_unseen5.py)
records each tensor the tuple holds: the merged graph's nodes are not the loader's
samples (graphs), so `--to dp` refuses, naming the tuple's line."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.runs

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dp"


def test_the_run_shows_the_graph_tuple_is_not_batch_first(cli, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "graph_pair.dp.py"
    result = cli(
        "convert", str(FIXTURES / "graph_pair.py"), "--to", "dp", "--amp", "off", "-o", str(out)
    )
    assert result.exit_code == 1
    assert (
        "graph_pair.py:50:1: error: loss inside forward (--to dp) not applied: `graph` is a tuple"
        in result.stderr
    )
    assert "the run does not show it batch-first: its element 0: shape [" in result.stderr
    assert not out.exists()
