"""Untouched lines stay byte-identical under `lint --fix` and `convert`: form feeds
(LibCST drops one that starts a top-level statement) and CRLF newlines, which inserted
lines follow too (issue 19)."""

from __future__ import annotations

import pytest
from conftest import SELECT

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.diff import unified_diff
from autoaccel.fileio import source_lines

# `--to dp` inserts a class with a multi-line docstring; ddp a whole set-up block.
SCRIPT = """\
import torch
from torch.utils.data import DataLoader
\f
loader = DataLoader(dataset, batch_size=32)
model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = torch.nn.CrossEntropyLoss()
for x, y in loader:
    x, y = x.cuda(), y.cuda()
    loss = criterion(model(x), y)
    \f
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
\fdef evaluate():
    pass
"""
FORM_FEED_LINES = ["\f", "    \f", "\fdef evaluate():"]


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("target", ["single", "dp", "ddp"])
def test_convert_keeps_form_feeds_and_newlines(target, newline):
    source = SCRIPT.replace("\n", newline)
    converted = convert_source(source, ConvertOptions(target=target), "train.py").converted
    assert converted != source
    lines = source_lines(converted, keepends=True)
    assert all(line.endswith(newline) for line in lines)
    for kept in FORM_FEED_LINES:
        assert kept + newline in lines
    assert converted.count("\f") == len(FORM_FEED_LINES)


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_lint_fix_keeps_form_feeds_and_newlines(cli, tmp_path, newline):
    path = tmp_path / "train.py"
    path.write_bytes(SCRIPT.replace("\n", newline).encode())
    assert cli("lint", *SELECT, "--fix", "--unsafe-fixes", "train.py").exit_code == 0
    data = path.read_bytes().decode()
    assert "num_workers" in data
    assert all(line.endswith(newline) for line in source_lines(data, keepends=True))
    for kept in FORM_FEED_LINES:
        assert kept + newline in source_lines(data, keepends=True)


def test_lines_split_only_where_python_ends_a_line():
    assert source_lines("a\fb\r\nc\u2028d\re\n") == ["a\fb", "c\u2028d", "e"]
    diff = unified_diff("x = 1\fy\nz = 2\n", "x = 1\fy\nz = 3\n", "t.py")
    assert source_lines(diff)[2:] == ["@@ -1,2 +1,2 @@", " x = 1\fy", "-z = 2", "+z = 3"]
