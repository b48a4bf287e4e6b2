"""ACC401: multi-GPU training with the single-process `nn.DataParallel`."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.script_model import DATA_PARALLEL, DISTRIBUTED_DATA_PARALLEL
from autoaccel.lint.rule import Invalid, LintRule


class DataParallelModel(LintRule):
    code = "ACC401"
    name = "data-parallel"
    message = (
        "`nn.DataParallel` drives every GPU from one Python process and replicates the model "
        "on each step; use `DistributedDataParallel` (`autoaccel convert --to ddp`)"
    )

    VALID = [
        # Only building the wrapper is reported, not naming the class.
        "import torch.nn as nn\nif isinstance(model, nn.DataParallel):\n    model = model.module\n",
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(model, device_ids=[rank])\n",
        # A user's own class of the same name.
        "import torch\n\n\nclass DataParallel:\n    pass\n\n\nmodel = DataParallel(model)\n",
        "import torch\nfrom mylib import DataParallel\nmodel = DataParallel(model)\n",
    ]
    INVALID = [
        Invalid("import torch\nmodel = torch.nn.DataParallel(model)\n"),
        Invalid("import torch.nn as nn\nmodel = nn.DataParallel(model).cuda()\n"),
        Invalid(
            "from torch import nn\nmodel = nn.parallel.DataParallel(model, device_ids=[0, 1])\n"
        ),
        Invalid("from torch.nn.parallel import DataParallel as DP\nnet = DP(Net())\n"),
        Invalid(
            "import torch\nfrom torch.nn.parallel.data_parallel import DataParallel\n"
            "net = DataParallel(Net())\n"
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.calls(node, DATA_PARALLEL):
            self.report(node)
