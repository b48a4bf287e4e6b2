"""ACC104: a DataLoader given both `shuffle=True` and a sampler (a ValueError)."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.names import name_key
from autoaccel.analysis.script_model import DATALOADER, KeywordValue
from autoaccel.cst_edit import remove_keyword, set_keyword
from autoaccel.lint.rule import Invalid, LintRule

_HEADER = "from torch.utils.data import DataLoader, DistributedSampler\n"
# `DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)`
_POSITIONS = {"shuffle": 2, "sampler": 3, "batch_sampler": 4}


class ShuffleWithSampler(LintRule):
    code = "ACC104"
    name = "shuffle-with-sampler"
    message = "`DataLoader` with `shuffle=True` and a sampler raises `ValueError`"
    fix_title = "Remove `shuffle=True`"

    VALID = [
        _HEADER + "sampler = DistributedSampler(ds)\nDataLoader(ds, sampler=sampler)\n",
        # The usual idiom: shuffle only when there is no sampler.
        _HEADER + "DataLoader(ds, shuffle=sampler is None, sampler=sampler)\n",
        _HEADER + "DataLoader(ds, shuffle=True, sampler=None)\n",
        _HEADER + "DataLoader(ds, shuffle=True)\n",
        # Values we cannot see.
        _HEADER + "DataLoader(ds, shuffle=args.shuffle, sampler=sampler)\n",
        _HEADER + "DataLoader(ds, shuffle=True, **options)\n",
        "from mylib import DataLoader\nDataLoader(ds, shuffle=True, sampler=sampler)\n",
    ]
    INVALID = [
        Invalid(
            _HEADER + "loader = DataLoader(ds, shuffle=True, sampler=DistributedSampler(ds))\n",
            fixed=_HEADER + "loader = DataLoader(ds, sampler=DistributedSampler(ds))\n",
        ),
        Invalid(
            _HEADER + "sampler = DistributedSampler(ds)\n"
            "loader = DataLoader(ds, batch_size=64, sampler=sampler, shuffle=True)\n",
            fixed=_HEADER + "sampler = DistributedSampler(ds)\n"
            "loader = DataLoader(ds, batch_size=64, sampler=sampler)\n",
        ),
        # A sampler that may be None: shuffle exactly when it is.
        Invalid(
            _HEADER + "sampler = DistributedSampler(ds) if distributed else None\n"
            "loader = DataLoader(ds, shuffle=True, sampler=sampler)\n",
            fixed=_HEADER + "sampler = DistributedSampler(ds) if distributed else None\n"
            "loader = DataLoader(ds, shuffle=sampler is None, sampler=sampler)\n",
        ),
        Invalid(
            _HEADER + "DataLoader(ds, batch_sampler=BatchSampler(s, 8, False), shuffle=True)\n",
            fixed=_HEADER + "DataLoader(ds, batch_sampler=BatchSampler(s, 8, False))\n",
        ),
        # Through a `**kwargs` dict: reported, not fixed.
        Invalid(
            _HEADER
            + "kw = {'shuffle': True}\nDataLoader(ds, sampler=DistributedSampler(ds), **kw)\n",
        ),
    ]

    def __init__(self, script) -> None:
        super().__init__(script)
        self._candidates: list[tuple[cst.Call, cst.BaseExpression, cst.BaseExpression]] = []
        self._bindings: dict[str, list[cst.BaseExpression | None]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        if not self.calls(node, DATALOADER):
            return
        shuffle = self._argument(node, "shuffle")
        if not _is_name(shuffle, "True"):
            return
        for keyword in ("sampler", "batch_sampler"):
            sampler = self._argument(node, keyword)
            if isinstance(sampler, cst.BaseExpression) and not _is_name(sampler, "None"):
                self._candidates.append((node, shuffle, sampler))  # type: ignore[arg-type]
                return

    # Every binding of a name, to tell a sampler that is never None.
    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target, node.value)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name, None)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        key = name_key(target)
        if key is not None:
            self._bindings.setdefault(key, []).append(value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value, None)

    def leave_Module(self, original_node: cst.Module) -> None:
        for call, shuffle, sampler in self._candidates:
            if not any(arg.value is shuffle and arg.keyword is not None for arg in call.args):
                self.report(call)  # positional, or in a `**kwargs` dict
            elif self._never_none(sampler):
                self.report(call, edits={call: remove_keyword(call, "shuffle")})
            elif name_key(sampler) is not None:
                condition = f"{name_key(sampler)} is None"
                self.report(call, edits={call: set_keyword(call, "shuffle", condition)})
            else:
                self.report(call)

    def _never_none(self, sampler: cst.BaseExpression) -> bool:
        if isinstance(sampler, cst.Call):
            return True
        key = name_key(sampler)
        values = self._bindings.get(key, []) if key else []
        return bool(values) and all(isinstance(value, cst.Call) for value in values)

    def _argument(self, call: cst.Call, name: str) -> KeywordValue:
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        if len(positional) > _POSITIONS[name]:
            return positional[_POSITIONS[name]].value
        return self.script.keyword(call, name)


def _is_name(value: KeywordValue, name: str) -> bool:
    return isinstance(value, cst.Name) and value.value == name
