"""The module index resolves names and parents exactly as LibCST's providers do."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.names import canonical
from autoaccel.rules import all_rules

ROOT = Path(__file__).resolve().parent.parent
SPELLINGS = """
import torch, torch.utils.data as tud
from torch.utils import data
from torch.nn import functional as F, Conv2d
import torch.nn.parallel
x = tud.DataLoader(ds); y = data.DataLoader; z = torch.nn.parallel.DataParallel(m)
print(F.mse_loss(a, b).item(), Conv2d(1, 2, 3).cuda())
def f(torch=None):
    global DataLoader
    from torch.utils.data import DataLoader
    return torch.zeros(1), [DataLoader(d) for d in sets], lambda t: t.cuda()
class DataLoader:
    torch = 1
    def g(self):
        return torch.ones(2), self.torch, DataLoader
DataLoader(ds)
"""


def sources():
    yield pytest.param(SPELLINGS, id="spellings")
    for path in sorted((ROOT / "fixtures").glob("*.py")):
        yield pytest.param(path.read_text(encoding="utf-8"), id=path.name)
    for rule in all_rules():
        examples = [*rule.VALID, *(invalid.source for invalid in rule.INVALID)]
        yield pytest.param("\n".join(examples), id=rule.code)


def _resolved(value):
    return value() if callable(value) else value


@pytest.mark.parametrize("source", list(sources()))
def test_names_and_parents_match_libcst(source):
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    expected = wrapper.resolve(QualifiedNameProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    index = ModuleIndex(module)
    for node in set(expected) | set(index.scopes):
        if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
            continue  # string annotations are not resolved
        names = {
            canonical(q.name)
            for q in _resolved(expected.get(node, ()))
            if q.source is not QualifiedNameSource.LOCAL
        }
        assert index.qualified_names(node) == names, module.code_for_node(node)
    for child, parent in index.parents.items():
        assert parents[child] is parent
