"""Names are resolved by LibCST's QualifiedNameProvider: `DataLoader` is found however
it is imported, and a user's own `DataLoader` (or another library's) is not."""

from __future__ import annotations

import pytest

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source

ACC101 = LintSettings(select=("ACC101",))


def codes(source: str) -> list[str]:
    return [d.code for d in lint_source(source, ACC101)]


# ACC101 reports loaders that feed a training loop: each spelling builds one.
TRAIN = "for x, y in loader:\n    model(x).sum().backward()\n"


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(
            "from torch.utils.data import DataLoader\nloader = DataLoader(ds)\n" + TRAIN,
            id="from-import",
        ),
        pytest.param(
            "from torch.utils.data import DataLoader as DL\nloader = DL(ds)\n" + TRAIN,
            id="from-import-as",
        ),
        pytest.param(
            "import torch\nloader = torch.utils.data.DataLoader(ds)\n" + TRAIN, id="import-torch"
        ),
        pytest.param(
            "import torch.utils.data\nloader = torch.utils.data.DataLoader(ds)\n" + TRAIN,
            id="import-dotted",
        ),
        pytest.param(
            "import torch.utils.data as tud\nloader = tud.DataLoader(ds)\n" + TRAIN, id="import-as"
        ),
        pytest.param(
            "from torch.utils import data\nloader = data.DataLoader(ds)\n" + TRAIN,
            id="from-package",
        ),
        pytest.param(
            "from torch.utils.data.dataloader import DataLoader\nloader = DataLoader(ds)\n" + TRAIN,
            id="defining-module",
        ),
        pytest.param(
            "import torch as th\nloader = th.utils.data.DataLoader(ds)\n" + TRAIN, id="torch-as"
        ),
        pytest.param(
            "def main():\n    from torch.utils.data import DataLoader\n    loader = DataLoader(ds)\n"
            "    for x, y in loader:\n        model(x).sum().backward()\n",
            id="local-import",
        ),
        pytest.param(
            "from torch.utils.data import DataLoader\n\n\nclass Trainer:\n"
            "    def __init__(self, ds):\n        self.loader = DataLoader(ds)\n"
            "    def fit(self):\n        for x, y in self.loader:\n            model(x).sum().backward()\n",
            id="in-a-method",
        ),
    ],
)
def test_dataloader_is_found_however_imported(source):
    assert codes(source) == ["ACC101"]


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(
            "import torch\n\n\nclass DataLoader:\n    pass\n\n\nDataLoader(ds)\n", id="own-class"
        ),
        pytest.param(
            "import torch\nfrom mylib import DataLoader\nDataLoader(ds)\n", id="other-library"
        ),
        pytest.param(
            "import torch\nfrom mylib.torch.utils.data import DataLoader\nDataLoader(ds)\n",
            id="other-library-torch-in-path",
        ),
        pytest.param("import torch\nDataLoader(ds)\n", id="never-imported"),
        pytest.param("import torch\nloader = 'DataLoader(ds)'\n", id="in-a-string"),
    ],
)
def test_other_dataloaders_are_not_reported(source):
    assert codes(source) == []
