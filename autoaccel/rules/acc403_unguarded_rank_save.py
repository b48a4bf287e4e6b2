"""ACC403: every rank of a distributed job writes the same checkpoint."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.rank_guards import mentions_rank, names_in, rank_guarded
from autoaccel.analysis.shapes import find
from autoaccel.analysis.script_model import DISTRIBUTED_DATA_PARALLEL
from autoaccel.lint.rule import Applicability, Invalid, LintRule

INIT_PROCESS_GROUP = frozenset({"torch.distributed.init_process_group"})
_GET_RANK = ("torch.distributed.get_rank",)
_RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK"})  # set by torchrun
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
        # Only called under a guard on a rank read from torchrun's environment.
        _DIST + "dist.init_process_group('nccl')\n\n\nclass Trainer:\n"
        "    def __init__(self):\n        self.gpu_id = int(os.environ['LOCAL_RANK'])\n"
        "    def save(self):\n        torch.save(self.model.state_dict(), 'snapshot.pt')\n"
        "    def train(self):\n        if self.gpu_id == 0:\n            self.save()\n",
        # The rank reaches the guard through a constructor (`mp.spawn` passes it).
        _DIST + "class Trainer:\n    def __init__(self, model, gpu_id):\n"
        "        self.gpu_id = gpu_id\n        self.model = DDP(model)\n"
        "    def save(self):\n        torch.save(self.model.state_dict(), 'c.pt')\n"
        "    def train(self):\n        if self.gpu_id == 0:\n            self.save()\n"
        "def main(rank):\n    dist.init_process_group('nccl')\n    Trainer(net, rank).train()\n",
        # Defined for another module, which may call it on rank 0 only.
        _DIST + "dist.init_process_group('nccl')\n\n\ndef save_checkpoint(model, path):\n"
        "    torch.save(model.state_dict(), path)\n",
        # One file per item: the ranks share the items out.
        _DIST + "dist.init_process_group('nccl')\nfor path in tqdm(paths):\n"
        "    torch.save(features(path), path + '.pt')\n",
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
        self.rank_names: set[str] = set()  # names bound to the process's rank
        self.referenced: set[str] = set()  # names used other than by a `def`
        self.parameters: dict[str, list[str]] = {}  # function -> its parameters
        self.constructors: dict[str, cst.FunctionDef] = {}  # class -> its `__init__`
        self.copies: list[tuple[list[str], str]] = []  # `a = b`: (targets, b)

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
            if not mentions_rank(node):
                self.saves.append((node, self._function(node)))
            return
        if isinstance(node.func, cst.Name):
            self.call_sites.setdefault(node.func.value, []).append(node)
        elif isinstance(node.func, cst.Attribute):
            self.call_sites.setdefault(node.func.attr.value, []).append(node)

    def visit_Name(self, node: cst.Name) -> None:
        if not isinstance(self.parent(node), cst.FunctionDef):
            self.referenced.add(node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        # `self.gpu_id = int(os.environ["LOCAL_RANK"])`, `r = dist.get_rank()`: a rank
        # under a name the rank test of `rank_guarded` does not know.
        targets = [key for target in node.targets if (key := name_key(target.target)) is not None]
        if any(
            isinstance(leaf, cst.SimpleString)
            and leaf.evaluated_value in _RANK_VARIABLES
            or isinstance(leaf, cst.Call)
            and self.calls(leaf, *_GET_RANK)
            for leaf in find(node.value, (cst.SimpleString, cst.Call))
        ):
            self.rank_names.update(targets)
        elif isinstance(node.value, cst.Name):
            self.copies.append((targets, node.value.value))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.parameters[node.name.value] = _parameters(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        # `Trainer(model, rank)` passes its arguments to `__init__`.
        for statement in node.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
                self.constructors[node.name.value] = statement

    def _rank_parameters(self) -> None:
        """`self.gpu_id = gpu_id` where a call passes the rank as `gpu_id`
        (`Trainer(model, rank)` under `mp.spawn`): `self.gpu_id` is a rank too."""
        ranks: set[str] = set()
        callables = [*self.parameters.items()] + [
            (cls, _parameters(init)) for cls, init in self.constructors.items()
        ]
        for function, params in callables:
            for call in self.call_sites.get(function, []):
                positional = [a for a in call.args if a.keyword is None and not a.star]
                passed = list(zip(params, (a.value for a in positional)))
                passed += [(a.keyword.value, a.value) for a in call.args if a.keyword is not None]
                ranks.update(
                    param
                    for param, value in passed
                    if mentions_rank(value) or name_key(value) in self.rank_names
                )
        for targets, source in self.copies:
            if source in ranks:
                self.rank_names.update(targets)

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self.distributed:
            return
        self._rank_parameters()
        guarded_functions: dict[cst.FunctionDef, bool] = {}
        for call, function in self.saves:
            if self._guarded(call) or self._writes_per_item(call):
                continue
            if function is not None and self._only_called_guarded(function, guarded_functions):
                continue
            edits, imports = self._fix(call)
            self.report(call, edits=edits, imports=imports)

    def _writes_per_item(self, call: cst.Call) -> bool:
        """A save in a loop over items (not over a `range`, nor an epoch or step loop):
        one file per item, and the ranks may share the items out."""
        for ancestor in self.ancestors(call):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return False
            if (
                isinstance(ancestor, cst.For)
                and ancestor not in self.script.epoch_loops
                and ancestor not in self.script.step_loops
                and not _over_range(self, ancestor.iter)
            ):
                return True
        return False

    # -- guards --------------------------------------------------------------------
    def _guarded(self, node: cst.CSTNode) -> bool:
        """Inside an `if` about the rank, or after `if <rank test>: return`."""
        if rank_guarded(node, self.ancestors(node)):
            return True
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
            if (
                isinstance(ancestor, cst.If)
                and child is not ancestor.test
                and any(
                    name_key(name) in self.rank_names
                    for name in find(ancestor.test, (cst.Name, cst.Attribute))
                )
            ):
                return True
            child = ancestor
        return False

    def _only_called_guarded(
        self, function: cst.FunctionDef, memo: dict[cst.FunctionDef, bool]
    ) -> bool:
        """Whether `function` has call sites in this module and all are guarded
        (directly, or inside functions that are themselves only called guarded)."""
        if function in memo:
            return memo[function]
        memo[function] = False  # recursion: not proven guarded
        sites = self.call_sites.get(function.name.value, [])
        if not sites and function.name.value not in self.referenced:
            memo[function] = True  # used by another module, which may guard the call
            return True
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


def _over_range(rule: LintRule, iterable: cst.BaseExpression) -> bool:
    """`range(n)`, also wrapped: `tqdm(range(n))`, `enumerate(range(n))`."""
    while isinstance(iterable, cst.Call):
        if rule.calls(iterable, "builtins.range"):
            return True
        if not iterable.args:
            return False
        iterable = iterable.args[0].value
    return False


def _parameters(function: cst.FunctionDef) -> list[str]:
    """The parameters a call fills, in order (`self` left out)."""
    params = [p.name.value for p in (*function.params.params, *function.params.kwonly_params)]
    return params[1:] if params[:1] == ["self"] else params
