"""ACC403: every rank of a distributed job writes the same checkpoint."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.rank_guards import mentions_rank, names_in, rank_guarded
from autoaccel.analysis.script_model import DISTRIBUTED_DATA_PARALLEL
from autoaccel.lint.rule import Applicability, Invalid, LintRule

INIT_PROCESS_GROUP = frozenset({"torch.distributed.init_process_group"})
# Identifiers that say "which process am I": `rank`, `args.local_rank`,
# `dist.get_rank()`, `is_main_process()`, `accelerator.is_main_process`, `is_master`.
_DIST = "import torch\nimport torch.distributed as dist\n"


class UnguardedRankSave(LintRule):
    code = "ACC403"
    name = "unguarded-rank-save"
    message = (
        "`torch.save` runs on every rank of a distributed job: all processes write the same "
        "file at once; save on rank 0 only"
    )
    fix_title = "Save only on rank 0 (or when `torch.distributed` is not initialised)"
    # Other ranks that read the checkpoint right after saving it now need a
    # `dist.barrier()`; see the doc.
    applicability = Applicability.UNSAFE

    VALID = [
        # Not a distributed script: one process, one writer.
        "import torch\ntorch.save(model.state_dict(), 'model.pt')\n",
        "import torch\nimport torch.nn as nn\nmodel = nn.DataParallel(model)\n"
        "torch.save(model.state_dict(), 'model.pt')\n",
        _DIST + "dist.init_process_group('nccl')\nif dist.get_rank() == 0:\n"
        "    torch.save(model.state_dict(), 'model.pt')\n",
        _DIST + "dist.init_process_group('nccl')\nif args.local_rank in (-1, 0):\n"
        "    torch.save(model.state_dict(), 'model.pt')\n",
        _DIST + "dist.init_process_group('nccl')\nif not rank:\n"
        "    torch.save(model.state_dict(), 'model.pt')\n",
        _DIST + "dist.init_process_group('nccl')\nif is_main_process() and epoch % 5 == 0:\n"
        "    torch.save(model.state_dict(), 'model.pt')\n",
        _DIST + "dist.init_process_group('nccl')\nif rank != 0:\n    pass\nelse:\n"
        "    torch.save(model.state_dict(), 'model.pt')\n",
        # An early return on the other ranks guards what follows.
        _DIST + "dist.init_process_group('nccl')\n\n\ndef save(model):\n"
        "    if dist.get_rank() != 0:\n        return\n"
        "    torch.save(model.state_dict(), 'model.pt')\n",
        # A function called only under a rank guard.
        _DIST + "dist.init_process_group('nccl')\n\n\ndef save_checkpoint(state, path):\n"
        "    torch.save(state, path)\n\n\nif args.rank % ngpus_per_node == 0:\n"
        "    save_checkpoint(state, 'ckpt.pt')\n",
        # One file per rank is meant to be written by every rank.
        _DIST + "dist.init_process_group('nccl')\n"
        "torch.save(optimizer.state_dict(), f'optim_rank{dist.get_rank()}.pt')\n",
        # A user's own `save`.
        _DIST + "from mylib import save\ndist.init_process_group('nccl')\nsave(model, 'm.pt')\n",
    ]
    INVALID = [
        Invalid(
            _DIST + "dist.init_process_group('nccl')\ntorch.save(model.state_dict(), 'model.pt')\n",
            fixed=_DIST + "dist.init_process_group('nccl')\n"
            "if not dist.is_initialized() or dist.get_rank() == 0:\n"
            "    torch.save(model.state_dict(), 'model.pt')\n",
        ),
        # Distributed because it wraps in DDP; the guard is not about the rank.
        Invalid(
            "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            "model = DDP(model)\nfor epoch in range(3):\n    if epoch % 2 == 0:\n"
            "        # checkpoint\n        torch.save(model.state_dict(), 'm.pt')  # every 2\n",
            fixed="import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
            "model = DDP(model)\nfor epoch in range(3):\n    if epoch % 2 == 0:\n"
            "        # checkpoint\n"
            "        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:\n"
            "            torch.save(model.state_dict(), 'm.pt')  # every 2\n",
        ),
        # A function called both with and without a guard; opened files are not
        # fixed (every rank would still truncate the file).
        Invalid(
            _DIST + "dist.init_process_group('nccl')\n\n\ndef save(path):\n"
            "    with open(path, 'wb') as f:\n        torch.save(model, f)\n\n\n"
            "if rank == 0:\n    save('a.pt')\nsave('b.pt')\n",
            fixed=None,
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self.distributed = False
        self.dist_prefix: str | None = None  # how the script spells `torch.distributed`
        self.saves: list[tuple[cst.Call, cst.FunctionDef | None]] = []
        self.call_sites: dict[str, list[cst.Call]] = {}

    # -- facts ---------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        if names & INIT_PROCESS_GROUP or DISTRIBUTED_DATA_PARALLEL in names:
            self.distributed = True
        if (
            self.dist_prefix is None
            and isinstance(node.func, cst.Attribute)
            and any(n.startswith("torch.distributed.") and n.count(".") == 2 for n in names)
        ):
            self.dist_prefix = cst.Module(body=[]).code_for_node(node.func.value)
        if "torch.save" in names:
            if not self._guarded(node) and not mentions_rank(node):
                self.saves.append((node, self._function(node)))
            return
        if isinstance(node.func, cst.Name):
            self.call_sites.setdefault(node.func.value, []).append(node)
        elif isinstance(node.func, cst.Attribute):
            self.call_sites.setdefault(node.func.attr.value, []).append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.distributed:
            return
        guarded_functions: dict[cst.FunctionDef, bool] = {}
        for call, function in self.saves:
            if function is not None and self._only_called_guarded(function, guarded_functions):
                continue
            edits, imports = self._fix(call)
            self.report(call, edits=edits, imports=imports)

    # -- guards --------------------------------------------------------------------
    def _guarded(self, node: cst.CSTNode) -> bool:
        """Inside an `if` about the rank, or after `if <rank test>: return`."""
        return rank_guarded(node, self.ancestors(node))

    def _only_called_guarded(
        self, function: cst.FunctionDef, memo: dict[cst.FunctionDef, bool]
    ) -> bool:
        """Whether `function` has call sites in this module and all are guarded
        (directly, or inside functions that are themselves only called guarded)."""
        if function in memo:
            return memo[function]
        memo[function] = False  # recursion: not proven guarded
        sites = self.call_sites.get(function.name.value, [])
        result = bool(sites) and all(
            self._guarded(site)
            or (
                (caller := self._function(site)) is not None
                and caller is not function
                and self._only_called_guarded(caller, memo)
            )
            for site in sites
        )
        memo[function] = result
        return result

    def _function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
        return None

    # -- fix -----------------------------------------------------------------------
    def _fix(self, call: cst.Call) -> tuple[dict[cst.CSTNode, cst.CSTNode] | None, tuple[str, ...]]:
        """Wrap a plain `torch.save(...)` statement line in a rank-0 guard."""
        expression = self.parent(call)
        line = self.parent(expression) if expression is not None else None
        block = self.parent(line) if line is not None else None
        if not (
            isinstance(expression, cst.Expr)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(block, (cst.IndentedBlock, cst.Module))
        ):
            return None, ()
        # `with open(path, "wb") as f: torch.save(x, f)`: every rank would still
        # open (and truncate) the file.
        handles = {
            name
            for ancestor in self.ancestors(call)
            if isinstance(ancestor, cst.With)
            for item in ancestor.items
            if item.asname is not None
            for name in names_in(item.asname.name)
        }
        if handles & names_in(call):
            return None, ()
        dist = self.dist_prefix or "torch.distributed"
        guard = cst.If(
            test=cst.parse_expression(f"not {dist}.is_initialized() or {dist}.get_rank() == 0"),
            body=cst.IndentedBlock(body=[line.with_changes(leading_lines=[])]),
            leading_lines=line.leading_lines,
        )
        return {line: guard}, () if self.dist_prefix else ("torch",)
