"""ACC401: multi-GPU training with the single-process `nn.DataParallel`."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.script_model import DATA_PARALLEL, DISTRIBUTED_DATA_PARALLEL
from autoaccel.analysis.shapes import find
from autoaccel.lint.rule import Invalid, LintRule

# Multi-process wrappers: a script that builds one already offers the fast path.
DISTRIBUTED_WRAPPERS = frozenset(
    {
        DISTRIBUTED_DATA_PARALLEL,
        "apex.parallel.DistributedDataParallel",
        "torch.distributed.fsdp.FullyShardedDataParallel",
    }
)


def offers_distributed(rule: LintRule, module: cst.Module) -> bool:
    """Whether the script also wraps a model for multi-process training (DDP, apex's
    DDP, FSDP): then `nn.DataParallel` is its fallback for single-process runs."""
    program = rule.script.program
    calls = program.calls if program is not None else find(module, cst.Call)
    return any(rule.calls(call, *DISTRIBUTED_WRAPPERS) for call in calls)


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
        # The fallback of a script that trains with DDP when it is launched that way.
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "if distributed:\n    model = DDP(model)\nelif n_gpu > 1:\n"
        "    model = torch.nn.DataParallel(model)\n",
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

    def __init__(self, script) -> None:
        super().__init__(script)
        self.wrappers: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.calls(node, DATA_PARALLEL):
            self.wrappers.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.wrappers and not offers_distributed(self, original_node):
            for wrapper in self.wrappers:
                self.report(wrapper)
