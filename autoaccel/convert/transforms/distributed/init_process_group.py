"""Start the process group from torchrun's environment, in a block after the imports.

torchrun starts one process per GPU and sets `RANK`, `LOCAL_RANK` and `WORLD_SIZE`;
each process drives the GPU of its local rank. Started with plain `python`, the
script sees none of them and runs as one process, as before. The block's names are
module-level so that every function and class of the script can read them. A module of
the project that the script imports and that gets DDP changes (its training loop, its
DataLoader) reads the same names from the environment; only the script starts the group.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.script_model import DISTRIBUTED_DATA_PARALLEL, LoopRole
from autoaccel.convert.transform import Transform
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    INIT_PROCESS_GROUP,
    has_setup_block,
    parse_statements,
    distributed_modules,
)
from autoaccel.convert.transforms.inserted_names import name_refusal
from autoaccel.cst_edit import add_import, leading_import_block

# The refusal of a script that starts its own process group (`convert` says "nothing to do").
ALREADY_DISTRIBUTED = "the script already sets up torch.distributed; convert it by hand"
_ENVIRONMENT = """DISTRIBUTED = "LOCAL_RANK" in os.environ
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))
"""
_NAMES = """
# Distributed training: torchrun starts one process per GPU and sets RANK, LOCAL_RANK
# and WORLD_SIZE. Run with plain `python`, the script is a single process, as before.
""" + _ENVIRONMENT
# For a module of the project that the script imports: the script starts the group.
MODULE_NAMES = """
# Distributed training: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE, and the script
# that imports this module starts the process group. Without torchrun: one process.
""" + _ENVIRONMENT
SETUP_BLOCK = _NAMES + """if DISTRIBUTED:
    if torch.cuda.is_available():
        torch.cuda.set_device(LOCAL_RANK)  # "cuda" now means this process's GPU
    # nccl for CUDA tensors, gloo for CPU tensors
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")
"""
# For a script that never uses CUDA.
CPU_SETUP_BLOCK = _NAMES + """if DISTRIBUTED:
    dist.init_process_group("gloo", init_method="env://")
"""


class InitProcessGroup(Transform):
    DESCRIPTION = "Start the process group from torchrun's environment variables."
    code = "ddp"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if has_setup_block(tree):
            return tree
        self.already_distributed: cst.Call | None = None
        super().transform_module_impl(tree)  # analysis only: fills self.script
        if not self.in_entry_script and not self._trains_here():
            return tree  # a module the script imports that no DDP change goes into
        if self.already_distributed is not None:
            self.skipped(
                "--to ddp",
                ALREADY_DISTRIBUTED,
                self.already_distributed,
                wrong=True,
            )
            return tree
        refusal = name_refusal(tree, self.context.filename)
        if refusal is not None:
            reason, node = refusal
            self.skipped("--to ddp", reason, node, wrong=True)
            return tree
        if not self.in_entry_script:
            return self._read_environment(tree)
        if not any(
            loop.role is LoopRole.TRAIN for loop in self.script.training.step_loops.values()
        ):
            self.skipped(
                "--to ddp", "no training loop (a loop that calls `.backward()`) found", wrong=True
            )
            return tree
        _, end = leading_import_block(tree)
        body = list(tree.body)
        block = parse_statements(SETUP_BLOCK if self.script.uses_cuda else CPU_SETUP_BLOCK)
        body[end:end] = block
        self.changed(
            tree.body[end - 1] if end else tree.body[0],
            "process group from torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE);"
            " one GPU per process; plain `python` still runs one process",
        )
        module = tree.with_changes(body=body)
        for statement in ("import os", "import torch", DIST_IMPORT):
            module = add_import(module, statement, needed_by=block[0])
        return module

    def _trains_here(self) -> bool:
        """Whether this module (one the script imports) is one the DDP changes go into."""
        script = self.script
        return script.module in distributed_modules(
            script.program, script.training, self.options.target
        )

    def _read_environment(self, tree: cst.Module) -> cst.Module:
        """A module the script imports reads RANK, LOCAL_RANK and WORLD_SIZE from the
        environment too; the script's own set-up block starts the process group."""
        _, end = leading_import_block(tree)
        body = list(tree.body)
        block = parse_statements(MODULE_NAMES)
        body[end:end] = block
        self.changed(
            tree.body[end - 1] if end else tree.body[0],
            "RANK, LOCAL_RANK and WORLD_SIZE from torchrun's environment (the script starts"
            " the process group)",
        )
        return add_import(tree.with_changes(body=body), "import os", needed_by=block[0])

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if self.already_distributed is None and (
            names & INIT_PROCESS_GROUP or DISTRIBUTED_DATA_PARALLEL in names
        ):
            self.already_distributed = node
