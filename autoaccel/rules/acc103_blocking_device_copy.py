"""ACC103: a batch copied to the GPU inside the step loop without `non_blocking=True`."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.dataset_cuda import loader_cuda_use
from autoaccel.analysis.devices import ACCELERATORS
from autoaccel.analysis.script_model import StepLoop, Unknown, device_leaves
from autoaccel.analysis.shapes import bound_names, find, is_attribute, is_false
from autoaccel.cst_edit import set_keyword
from autoaccel.lint.rule import Applicability, Invalid, LintRule

_LOOP = (
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "device = torch.device('cuda')\n"
    "loader = DataLoader(ds)\n"
    "for x, y in loader:\n"
    "    {}\n"
    "    loss = criterion(model(x), y)\n"
    "    loss.backward()\n"
)
_EVALUATION = (
    "with torch.no_grad():\n    for x, y in loader:\n        out = model(x.to(device{}))\n"
)


class BlockingDeviceCopy(LintRule):
    code = "ACC103"
    name = "blocking-device-copy"
    message = "Batch is copied to the GPU synchronously (no `non_blocking=True`)"
    fix_title = "Add `non_blocking=True`"
    # An asynchronous copy returns before the data has arrived: a script that reads
    # the source tensor's memory from the host meanwhile, or times the step, sees a
    # different ordering; from pageable memory it gains nothing.
    applicability = Applicability.UNSAFE

    VALID = [
        _LOOP.format("x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)"),
        _LOOP.format("x = x.cuda(non_blocking=True)"),
        # A user's explicit choice is kept.
        _LOOP.format("x = x.to(device, non_blocking=False)"),
        # Only a dtype: no copy between devices.
        _LOOP.format("x = x.to(torch.float16)"),
        _LOOP.format("x = x.to(dtype=torch.float16)"),
        # Device to host.
        _LOOP.format("x = x.to('cpu')"),
        _LOOP.format("x = x.cpu()"),
        # The model, not a batch.
        _LOOP.format("model.to(device)"),
        # A keyword we cannot see.
        _LOOP.format("x = x.to(device, **options)"),
        # A legacy tensor type of the CPU, or a dtype: no copy between devices.
        _LOOP.format("x = x.type(torch.FloatTensor)"),
        _LOOP.format("x = x.type(torch.float16)"),
        # Another tensor as the target: device and dtype are unknown.
        _LOOP.format("x = x.to(y)"),
        # Outside a step loop.
        "import torch\ndevice = torch.device('cuda')\nx = x.to(device)\n",
        # A CPU-only script.
        _LOOP.replace("'cuda'", "'cpu'").format("x = x.to(device)"),
        # An evaluation loop over pageable batches: `non_blocking` alone gains nothing
        # (ACC102 pins only the loaders that feed training).
        "import torch\nfrom torch.utils.data import DataLoader\ndevice = torch.device('cuda')\n"
        "loader = DataLoader(ds)\n" + _EVALUATION.format(""),
        # Samples the Dataset makes on the GPU: ACC102 leaves the loader unpinned.
        _LOOP.replace(
            "loader = DataLoader(ds)",
            "class Clips(torch.utils.data.Dataset):\n    def __getitem__(self, i):\n"
            "        return self.clips[i].cuda(), self.labels[i]\nloader = DataLoader(Clips())",
        ).format("x = x.to(device)"),
        # Batches from a loader we cannot see (pinned or not).
        _LOOP.replace("loader = DataLoader(ds)\n", "").format("x = x.to(device)"),
    ]
    INVALID = [
        Invalid(
            _LOOP.format("x, y = x.to(device), y.to(device)"),
            fixed=_LOOP.format(
                "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)"
            ),
        ),
        Invalid(
            _LOOP.format("x = x.cuda()"),
            fixed=_LOOP.format("x = x.cuda(non_blocking=True)"),
        ),
        Invalid(
            _LOOP.format("x = x.to('cuda:0', torch.float16)"),
            fixed=_LOOP.format("x = x.to('cuda:0', torch.float16, non_blocking=True)"),
        ),
        # A legacy tensor type of the GPU (old PyTorch-GAN style).
        Invalid(
            _LOOP.replace("loader =", "Tensor = torch.cuda.FloatTensor\nloader =").format(
                "x = x.type(Tensor)"
            ),
            fixed=_LOOP.replace("loader =", "Tensor = torch.cuda.FloatTensor\nloader =").format(
                "x = x.type(Tensor, non_blocking=True)"
            ),
        ),
        Invalid(
            _LOOP.format("inputs = x.float()\n    inputs = inputs.to(device=device)"),
            fixed=_LOOP.format(
                "inputs = x.float()\n    inputs = inputs.to(device=device, non_blocking=True)"
            ),
        ),
        # An evaluation loop over the training loader, which ACC102 pins: in the same
        # pass, not only once its `pin_memory` is written (another module may build it).
        Invalid(
            _LOOP.format("x = x.to(device, non_blocking=True)") + _EVALUATION.format(""),
            fixed=_LOOP.format("x = x.to(device, non_blocking=True)")
            + _EVALUATION.format(", non_blocking=True"),
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self._batches: dict[cst.CSTNode, frozenset[str]] = {}
        # Devices the script model misses: `self.device = device or torch.device(...)`.
        self._devices: set[str] = set()
        # Copies whose target is a name, decided once every assignment has been seen.
        self._pending: list[tuple[cst.Call, str]] = []
        self._cpu: set[str] = set()  # names only ever bound to the CPU device

    def visit_Assign(self, node: cst.Assign) -> None:
        kinds = {self._device_kind(leaf) for leaf in device_leaves(node.value)}
        for target in node.targets:
            key = name_key(target.target)
            if key is None:
                continue
            if "cuda" in kinds:
                self._devices.add(key)
            elif kinds == {"cpu"}:
                self._cpu.add(key)

    def visit_Call(self, node: cst.Call) -> None:
        # `tensor.to(...)` / `tensor.cuda(...)` / `tensor.type(torch.cuda.FloatTensor)` with
        # everything passed written out.
        if not is_attribute(node.func, "to", "cuda", "type"):
            return
        if any(arg.star for arg in node.args) or _keyword(node, "non_blocking") is not None:
            return
        method = node.func.attr.value  # type: ignore[attr-defined]
        positional = [arg for arg in node.args if arg.keyword is None]
        target = None
        if method == "cuda":
            # `.cuda(device=None, non_blocking=False)`
            if len(positional) > 1:
                return
        elif method == "type":
            # `.type(dtype=None, non_blocking=False)`: a legacy tensor type of the GPU
            # (`Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`)
            dtype = positional[0].value if positional else _keyword(node, "dtype")
            if len(positional) > 1 or dtype is None:
                return
            if not self.script.device_types(dtype) & ACCELERATORS:
                return
        else:
            target = positional[0].value if positional else _keyword(node, "device")
            if len(positional) > 2 or target is None:
                return
        loop = self.enclosing_step_loop(node)
        if loop is None or not self._pinned_batches(loop):
            return
        if not self._from_batch(node.func.value, self._batch_names(loop)):  # type: ignore[attr-defined]
            return
        kind = "cuda" if target is None else self._device_kind(target)  # `.cuda()`, `.type(T)`
        if kind is None:
            # a device made elsewhere in the program: `current_accelerator()` with a CPU
            # fallback is on the accelerator path, a CPU device alone is not
            types = self.script.device_types(target)
            if types & ACCELERATORS:
                kind = "cuda"
            elif types:
                return
        if kind == "cuda":
            self._report(node)
        elif kind is None and self.script.uses_cuda and name_key(target) is not None:
            self._pending.append((node, name_key(target)))  # type: ignore[arg-type]

    def leave_Module(self, original_node: cst.Module) -> None:
        for node, key in self._pending:
            if key in self._devices or (key in self.script.devices and key not in self._cpu):
                self._report(node)

    def _pinned_batches(self, loop: StepLoop) -> bool:
        """Whether the loop reads a loader whose batches are page-locked, or will be once
        ACC102 pins the loaders that feed a training loop (this one or another, such as
        an evaluation loop over the training data): from pageable memory the copy stays
        synchronous whatever `non_blocking` says."""
        calls = self.script.loaders.get(loop.loader) if loop.loader is not None else None
        if not calls:
            return False
        for call in calls:
            pinned = self.script.keyword(call, "pin_memory")
            if isinstance(pinned, Unknown):
                return False  # ACC102 cannot tell either: it leaves the loader alone
            written = isinstance(pinned, cst.BaseExpression) and not is_false(pinned)
            if not written and (
                not self.feeds_training_loop(call) or loader_cuda_use(call, self.script)
            ):
                return False  # ACC102 pins only training loaders of samples made on the CPU
        return True

    def _report(self, node: cst.Call) -> None:
        self.report(node, edits={node: set_keyword(node, "non_blocking", "True")})

    def _device_kind(self, value: cst.BaseExpression) -> str | None:
        """ "cuda" / "cpu" for a device written out (`"cuda:0"`, `torch.device("cpu")`)."""
        if isinstance(value, cst.Call) and self.calls(value, "torch.device"):
            if not value.args:
                return None
            if isinstance(value.args[0].value, cst.SimpleString):
                return self._device_kind(value.args[0].value)
            return "cuda" if self.script.uses_cuda else None
        if isinstance(value, cst.SimpleString):
            text = value.evaluated_value
            if isinstance(text, str):
                if text == "cuda" or text.startswith("cuda:"):
                    return "cuda"
                if text == "cpu":
                    return "cpu"
        return None

    def _from_batch(self, value: cst.BaseExpression, names: frozenset[str]) -> bool:
        """`_derives`, and the items of a comprehension over (part of) a batch:
        `[{k: v.to(device) for k, v in t.items()} for t in targets]`."""
        if _derives(value, names):
            return True
        root = value
        while not isinstance(root, cst.Name):
            if isinstance(root, (cst.Subscript, cst.Attribute)):
                root = root.value
            elif isinstance(root, cst.Call) and isinstance(root.func, cst.Attribute):
                root = root.func.value
            else:
                return False
        for ancestor in self.ancestors(root):
            if isinstance(ancestor, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
                comp_for: cst.CompFor | None = ancestor.for_in
                while comp_for is not None:
                    if root.value in bound_names(comp_for.target):
                        return self._from_batch(comp_for.iter, names)
                    comp_for = comp_for.inner_for_in
            elif isinstance(ancestor, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return False
        return False

    def _batch_names(self, loop) -> frozenset[str]:
        """The loop target's names plus names assigned in the body from them."""
        if loop.node not in self._batches:
            names = set(loop.batch_names)
            assignments = find(loop.node.body, cst.Assign)
            changed = True
            while changed:
                changed = False
                for assign in assignments:
                    for target in assign.targets:
                        for bound in _bound_from(target.target, assign.value, names):
                            if bound not in names:
                                names.add(bound)
                                changed = True
            self._batches[loop.node] = frozenset(names)
        return self._batches[loop.node]


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def _derives(value: cst.BaseExpression, names: frozenset[str] | set[str]) -> bool:
    """`x`, `x[0]`, `x.attr`, `x.float()` for a batch name `x`."""
    while True:
        if isinstance(value, cst.Name):
            return value.value in names
        if isinstance(value, (cst.Subscript, cst.Attribute)):
            value = value.value
        elif isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            value = value.func.value
        else:
            return False


def _bound_from(
    target: cst.BaseExpression, value: cst.BaseExpression, names: set[str]
) -> list[str]:
    """Names in `target` that `target = value` binds to (part of) a batch."""
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) == len(value.elements):
            return [
                bound
                for t, v in zip(target.elements, value.elements)
                for bound in _bound_from(t.value, v.value, names)
            ]
        return []
    if not _derives(value, names):
        return []
    return bound_names(target)
