"""ACC105: a shuffling DistributedSampler whose epoch is never set."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import DATALOADER, DISTRIBUTED_SAMPLER, LoopRole, Missing
from autoaccel.lint.rule import Invalid, LintRule

# `DistributedSampler(dataset, num_replicas, rank, shuffle, ...)`
_SHUFFLE_POSITION = 3
# `DataLoader(dataset, batch_size, shuffle, sampler, ...)`
_SAMPLER_POSITION = 3

_HEADER = (
    "from torch.utils.data import DataLoader\n"
    "from torch.utils.data.distributed import DistributedSampler\n"
)
_TRAIN = (
    "for epoch in range(10):\n"
    "    {}\n"
    "    for x, y in loader:\n"
    "        loss = model(x)\n"
    "        loss.backward()\n"
)


class SamplerEpochNotSet(LintRule):
    code = "ACC105"
    name = "sampler-epoch-not-set"
    message = (
        "`DistributedSampler` shuffles but `set_epoch()` is never called: "
        "every epoch sees the same order"
    )

    VALID = [
        _HEADER
        + "sampler = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=sampler)\n"
        + _TRAIN.format("sampler.set_epoch(epoch)"),
        _HEADER
        + "loader = DataLoader(ds, sampler=DistributedSampler(ds))\n"
        + _TRAIN.format("loader.sampler.set_epoch(epoch)"),
        # A sampler that does not shuffle has nothing to reseed.
        _HEADER + "sampler = DistributedSampler(ds, shuffle=False)\n"
        "loader = DataLoader(ds, sampler=sampler)\n" + _TRAIN.format("pass"),
        _HEADER + "sampler = DistributedSampler(ds, shuffle=args.shuffle)\n"
        "loader = DataLoader(ds, sampler=sampler)\n" + _TRAIN.format("pass"),
        # `set_epoch` on something we cannot follow (an alias, a helper): may be ours.
        _HEADER
        + "sampler = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=sampler)\n"
        + _TRAIN.format("samplers[0].set_epoch(epoch)"),
        # A loader that only evaluates: its order does not matter.
        _HEADER + "sampler = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=sampler)\n"
        "for x, y in loader:\n    out = model(x)\n",
        "from mylib import DistributedSampler\nimport torch\nsampler = DistributedSampler(ds)\n",
        # The loader leaves for a training loop of another module.
        _HEADER + "def make_loader(ds):\n    sampler = DistributedSampler(ds)\n"
        "    loader = DataLoader(ds, sampler=sampler)\n    return loader\n",
        # The sampler goes to a function of another module, which may set its epoch.
        _HEADER + "from utils import train\nsampler = DistributedSampler(ds)\n"
        "loader = DataLoader(ds, sampler=sampler)\n" + _TRAIN.format("train(loader, sampler)"),
    ]
    INVALID = [
        Invalid(
            _HEADER
            + "sampler = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=sampler)\n"
            + _TRAIN.format("pass")
        ),
        Invalid(
            "import torch\nclass Trainer:\n    def __init__(self, ds):\n"
            "        self.sampler = torch.utils.data.DistributedSampler(ds, shuffle=True)\n"
            "        self.loader = torch.utils.data.DataLoader(ds, sampler=self.sampler)\n"
            "    def fit(self):\n        for x in self.loader:\n            model(x).backward()\n"
        ),
        # Inline: nothing can reach it but `loader.sampler`.
        Invalid(
            _HEADER
            + "loader = DataLoader(ds, sampler=DistributedSampler(ds))\n"
            + _TRAIN.format("pass")
        ),
        # The epoch of the other sampler is set, not this one's.
        Invalid(
            _HEADER + "a = DistributedSampler(ds)\nb = DistributedSampler(ds)\n"
            "loader = DataLoader(ds, sampler=b)\n" + _TRAIN.format("a.set_epoch(epoch)")
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self._named: dict[cst.Call, str] = {}  # sampler call -> the name it is bound to
        self._inline: dict[cst.Call, cst.Call] = {}  # sampler call -> DataLoader call
        self._receivers: set[str] = set()  # `x` of `x.set_epoch(...)`
        self._opaque = False  # a `set_epoch` on something we cannot name
        self._calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self._calls.append(node)
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "set_epoch":
            receiver = _receiver_key(func.value)
            if receiver is None:
                self._opaque = True
            else:
                self._receivers.add(receiver)
            return
        if not self.calls(node, DISTRIBUTED_SAMPLER) or not self._shuffles(node):
            return
        owner = self._owner(node)
        if isinstance(owner, str):
            self._named[node] = owner
        elif isinstance(owner, cst.Call):
            self._inline[node] = owner

    def _shuffles(self, call: cst.Call) -> bool:
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        if len(positional) > _SHUFFLE_POSITION:
            shuffle = positional[_SHUFFLE_POSITION].value
        else:
            shuffle = self.script.keyword(call, "shuffle")
        if isinstance(shuffle, Missing):
            return True  # the default shuffles
        return isinstance(shuffle, cst.Name) and shuffle.value == "True"

    def _owner(self, node: cst.Call) -> str | cst.Call | None:
        """The name the sampler is bound to, or the DataLoader it is passed to inline."""
        child: cst.CSTNode = node
        parent = self.get_metadata(ParentNodeProvider, node, None)
        # `DistributedSampler(ds) if distributed else None`
        while isinstance(parent, cst.IfExp) and child is not parent.test:
            child, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return name_key(parent.targets[0].target)
        if isinstance(parent, cst.AnnAssign):
            return name_key(parent.target)
        if isinstance(parent, cst.Arg):
            call = self.get_metadata(ParentNodeProvider, parent, None)
            if isinstance(call, cst.Call) and self.calls(call, DATALOADER):
                positional = [a for a in call.args if a.keyword is None and not a.star]
                if (parent.keyword is not None and parent.keyword.value == "sampler") or (
                    len(positional) > _SAMPLER_POSITION and positional[_SAMPLER_POSITION] is parent
                ):
                    return call
        return None

    def leave_Module(self, original_node: cst.Module) -> None:
        if self._opaque or not (self._named or self._inline):
            return
        # Which loaders each sampler feeds, to follow `loader.sampler.set_epoch()`.
        feeds: dict[cst.Call, set[str]] = {
            sampler: set() for sampler in (*self._named, *self._inline)
        }
        by_name = {key: sampler for sampler, key in self._named.items()}
        for loader, calls in self.script.loaders.items():
            for call in calls:
                for sampler, loader_call in self._inline.items():
                    if loader_call is call:
                        feeds[sampler].add(loader)
                value = self.script.keyword(call, "sampler")
                key = name_key(value) if isinstance(value, cst.BaseExpression) else None
                if key in by_name:
                    feeds[by_name[key]].add(loader)  # type: ignore[index]
        known = set(self._named.values()) | {f"{loader}.sampler" for loader in self.script.loaders}
        if not self._receivers <= known:
            return  # `set_epoch` on an alias we do not follow
        for sampler, loaders in feeds.items():
            if self._named.get(sampler) in self._receivers or any(
                f"{loader}.sampler" in self._receivers for loader in loaders
            ):
                continue
            # The epochs must run here: a loader (or sampler) that leaves for another
            # module's training loop may get its `set_epoch` there.
            if self._trains_here(loaders) and not self._handed_on(sampler):
                self.report(sampler)

    def _trains_here(self, loaders: set[str]) -> bool:
        """Whether a training step loop of this file reads one of `loaders`."""
        return any(
            loop.role is LoopRole.TRAIN and loop.loader in loaders
            for loop in self.script.step_loops.values()
        )

    def _handed_on(self, sampler: cst.Call) -> bool:
        """Whether the sampler's name is passed to a call other than a DataLoader."""
        name = self._named.get(sampler)
        return name is not None and any(
            name_key(arg.value) == name and not self.calls(call, DATALOADER)
            for call in self._calls
            for arg in call.args
        )


def _receiver_key(value: cst.BaseExpression) -> str | None:
    """`sampler`, `self.sampler` or `loader.sampler` / `self.loader.sampler`."""
    key = name_key(value)
    if key is not None:
        return key
    if isinstance(value, cst.Attribute) and value.attr.value == "sampler":
        loader = name_key(value.value)
        return f"{loader}.sampler" if loader is not None else None
    return None
