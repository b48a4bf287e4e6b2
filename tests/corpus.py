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

# Layouts LibCST writes its own way: CRLF, no last newline, tabs, form feeds...
LAYOUTS = {
    "crlf": "x = 1\r\nif x:\r\n    y = (\r\n  2)\r\n",
    "no-final-newline": "import torch\nloss = torch.zeros(1).cuda()",
    "decorators": "@d\n\n# c\n@e(1)\ndef f(a, *, b): return a; pass\nclass C: pass\n",
    "compound": (
        "if a: b\nelif c: d\nelse:\n  e\ntry:\n  pass\nexcept E as e:\n  pass\n"
        "finally:\n  pass\nwith a as b, c: pass\nmatch x:\n  case [1, *r] if r: pass\n"
    ),
    "nested": (
        "def f(x):\n\tif x:\n\t\tpass\n  # odd comment\n\telif y:  # c\n\t\tz = \\\n  1\n"
        "\telse: a; b\n\n\nclass C:\n    @staticmethod\n    # c\n    @d\n    def g(): ...\n"
    ),
    "form-feed": "x = 1\n\n\x0cclass C:\n    pass\n",
    "comments-only": "\n\n# only a comment",
    "empty": "",
}


def sources():
    yield pytest.param(SPELLINGS, id="spellings")
    for path in sorted((ROOT / "fixtures").glob("*.py")):
        yield pytest.param(path.read_text(encoding="utf-8"), id=path.name)
    for rule in all_rules():
        examples = [*rule.VALID, *(invalid.source for invalid in rule.INVALID)]
        yield pytest.param("\n".join(examples), id=rule.code)


def layouts():
    for name, text in LAYOUTS.items():
        yield pytest.param(text, id=name)
