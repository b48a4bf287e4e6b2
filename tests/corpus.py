"""Source texts that analysis tests compare against LibCST's own providers: an import
spelling sampler, every fixture, and the examples of every rule."""

from __future__ import annotations

from pathlib import Path

import pytest

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
